"""state_resume.py: a trainer whose State saves checkpoints to the job's EDL_CHECKPOINT_URI,
for test_torch_state.py. Each entry into the elastic function prints where it starts
("entered at commit C epoch E position P"); with --crash-at N the first process of the job
(TORCHELASTIC_RESTART_COUNT 0) waits for its saves and SIGKILLs itself after commit N (a crash
from outside, as the OOM killer's: an exit code of its own would be judged the script's bug
and fail the job), so that the next generation's process starts with no state and resumes
from the checkpoint. With --foreign,
rank 0 first saves a checkpoint in a shape State cannot resume from (no model, no optimizer).

    state_resume.py [--every 10] [--crash-at N] [--foreign] [--samples 640] [--batch 16]
"""
import argparse
import os
import signal

import torch

import edl
import edl.checkpoint as ckpt
import edl.torch as et


def main(a):
    url = os.environ["EDL_CHECKPOINT_URI"]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if a.foreign and edl.context().rank == 0 and ckpt.load_latest(url) is None:
        ckpt.save({"net": model.state_dict(), "iteration": 5}, 5, url)
    sampler = et.ElasticSampler(a.samples, global_batch_size=a.batch)
    state = et.State(model=model, optimizer=opt, sampler=sampler, epoch=0, checkpoint=url,
                     every=a.every)
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    @et.elastic
    def train(state):
        print(f"entered at commit {state.commits} epoch {state.epoch} position "
              f"{sampler.position}", flush=True)
        for state.epoch in range(state.epoch, 2):
            for idx in sampler.batches(state.epoch):
                opt.zero_grad()
                model(torch.randn(len(idx), 4)).pow(2).mean().backward()
                et.allreduce_gradients(model)
                opt.step()
                state.commit()
                if first and state.commits == a.crash_at:
                    state.wait()
                    os.kill(os.getpid(), signal.SIGKILL)

    train(state)
    print(f"done at commit {state.commits}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--crash-at", type=int, default=-1)
    p.add_argument("--foreign", action="store_true")
    p.add_argument("--samples", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    main(p.parse_args())
