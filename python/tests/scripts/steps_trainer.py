"""steps_trainer.py: examples/python/train_elastic.py's MLP (same data, model, seed and global
batch, so its final weights are train_local.py's) committing only every --commit-every steps,
and printing one line per step it runs, for test_torch_elastic.py and bench/torch_reform.py:

    edl-steps pod P step S rank R world W t T

S counts the job's steps (it is part of the State: a rank that goes back to its last commit
prints the steps since that commit again), T is the wall clock when the step ended.

    steps_trainer.py [--epochs 3] [--samples 2048] [--batch 64] [--commit-every 5]
                     [--step-ms 0] [--out weights.pt]
"""
import argparse
import os
import sys
import time

import torch

import edl.torch as et

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                                "python"))
from train_elastic import data  # noqa: E402  (the example's data, not a copy of it)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--commit-every", type=int, default=5)
    p.add_argument("--step-ms", type=float, default=0)
    p.add_argument("--out")
    args = p.parse_args()
    x, y = data(args.samples)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = et.ElasticSampler(args.samples, global_batch_size=args.batch)
    state = et.State(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0)
    pod = os.environ.get("EDL_POD_ID", "local")

    @et.elastic
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            for idx in sampler.batches(state.epoch):
                opt.zero_grad()
                loss = ((model(x[idx]) - y[idx]) ** 2).sum() / args.batch
                loss.backward()
                et.allreduce_gradients(model, average=False)  # the loss is over the global batch
                opt.step()
                state.step += 1
                w = et.world()
                print(f"edl-steps pod {pod} step {state.step} rank {w.rank} world "
                      f"{w.world_size} t {time.time():.4f}", flush=True)
                last = sampler.position >= sampler.n and state.epoch == args.epochs - 1
                if state.step % args.commit_every == 0 or last:
                    state.commit()
                time.sleep(args.step_ms / 1000)

    train(state)
    if args.out:
        torch.save(model.state_dict(), f"{args.out}.{os.getpid()}")
        os.replace(f"{args.out}.{os.getpid()}", args.out)


if __name__ == "__main__":
    main()
