"""A small MLP learns a planted function of generated data: train_local.py in one process,
train_elastic.py the same made elastic with edl (`diff train_local.py train_elastic.py`:
twelve lines). Both print the final loss and can save the final weights (--out), so that a run
with joins, leaves and crashes can be compared with one without. With the job's checkpoint URI
(`edl run --checkpoint-uri`) the elastic one saves every 10th commit there and, started with no
state anywhere in the job, resumes from the newest checkpoint.

    python3 examples/python/train_local.py --epochs 3 --out local.pt
    build/bin/edl run --np 1:4 --replicas 2 --elastic-mode inprocess -- \
        python3 examples/python/train_elastic.py --epochs 3 --out elastic.pt
"""
import argparse
import os
import time

import torch
import edl.torch as et


def data(n):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(n, 1, generator=g)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64, help="samples per step (the global batch)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-ms", type=float, default=0, help="sleep per step (demos, tests)")
    p.add_argument("--out", help="save the final weights here")
    args = p.parse_args()
    x, y = data(args.samples)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = et.ElasticSampler(args.samples, global_batch_size=args.batch)
    state = et.State(model=model, optimizer=opt, sampler=sampler, epoch=0,
                     checkpoint=os.environ.get("EDL_CHECKPOINT_URI"), every=10)

    @et.elastic
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            for idx in sampler.batches(state.epoch):
                opt.zero_grad()
                loss = ((model(x[idx]) - y[idx]) ** 2).sum() / args.batch
                loss.backward()
                et.allreduce_gradients(model, average=False)  # the loss is over the global batch
                opt.step()
                state.commit()
                time.sleep(args.step_ms / 1000)

    train(state)
    loss = ((model(x) - y) ** 2).mean().item()
    print(f"final loss {loss:.6f}", flush=True)
    if args.out:  # atomically: every rank of an elastic run writes the same weights
        torch.save(model.state_dict(), f"{args.out}.{os.getpid()}")
        os.replace(f"{args.out}.{os.getpid()}", args.out)


if __name__ == "__main__":
    main()
