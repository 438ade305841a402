"""A trainer with a bug: it raises ValueError at step --at on rank --rank (-1: every rank).

With --plain it does not use edl.torch (a script of its own, steps on a timer), so the judgement
of restart mode, not edl.torch's mark, has to find the bug. Used by test_fail_fast.py."""
import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--at", type=int, default=50)
p.add_argument("--rank", type=int, default=-1)
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--step-ms", type=float, default=10)
p.add_argument("--plain", action="store_true")
args = p.parse_args()


def step_done(rank, step):
    if step == args.at and args.rank in (-1, rank):
        raise ValueError(f"boom at step {step}")
    time.sleep(args.step_ms / 1000)


if args.plain:
    rank = int(os.environ.get("RANK", "0"))
    for step in range(1, args.steps + 1):
        step_done(rank, step)
else:
    import torch
    import edl.torch as et

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = et.State(model=model, optimizer=opt, step=0)

    @et.elastic
    def train(state):
        while state.step < args.steps:
            opt.zero_grad()
            model(torch.ones(8, 4)).sum().backward()
            et.allreduce_gradients(model)
            opt.step()
            state.step += 1
            state.commit()
            step_done(et.world().rank, state.step)

    train(state)
