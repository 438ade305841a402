"""An MLP learns a planted function, trained the way most PyTorch users train: torch's
DistributedDataParallel under torchrun, a DataLoader with worker processes over a
DistributedSampler, an LR scheduler, and a checkpoint each epoch (rank 0 writes it, every rank
resumes from it). train_ddp_elastic.py is the same script made elastic with edl; a test keeps
`diff train_ddp.py train_ddp_elastic.py` within ten changed lines (docs/python.md walks
through them).

    python3 -m torch.distributed.run --nproc_per_node 2 examples/python/train_ddp.py
    build/bin/edl run --np 1:4 --replicas 2 -- python3 examples/python/train_ddp_elastic.py
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import edl.torch as et
from edl.torch import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def data(n):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(n, 1, generator=g)


def resume(path, model, opt, sched):
    """The epoch to start from: 0, or the one after the checkpoint at path."""
    if not path or not os.path.exists(path):
        return 0
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    return ckpt["epoch"] + 1


def save(path, model, opt, sched, epoch):
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "epoch": epoch}
    torch.save(ckpt, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64, help="samples per step over all ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--checkpoint", help="a checkpoint file, written each epoch by rank 0")
    p.add_argument("--step-ms", type=float, default=0, help="sleep per step (demos, tests)")
    p.add_argument("--out", help="save the final weights here")
    args = p.parse_args()
    x, y = data(args.samples)
    dataset = TensorDataset(x, y)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    loss_fn = torch.nn.MSELoss()
    start = resume(args.checkpoint, model, opt, sched)
    sampler = et.ElasticSampler(dataset, global_batch_size=args.batch, epoch=start)
    loader = et.DataLoader(dataset, batch_sampler=sampler, num_workers=args.workers)
    state = et.State(model=model, optimizer=opt, sampler=sampler, scheduler=sched)

    @et.elastic(state)
    def train():
        for epoch in range(sampler.epoch, args.epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                opt.zero_grad()
                loss_fn(model(xb), yb).backward()
                opt.step()
                state.commit()
                time.sleep(args.step_ms / 1000)
            sched.step()
            if args.checkpoint and dist.get_rank() == 0:  # one writer, after the epoch
                save(args.checkpoint, model, opt, sched, epoch)

    train()
    loss = loss_fn(model.module(x), y).item()
    print(f"final loss {loss:.6f}", flush=True)
    if args.out:  # atomically: every rank writes the same weights
        torch.save(model.module.state_dict(), f"{args.out}.{os.getpid()}")
        os.replace(f"{args.out}.{os.getpid()}", args.out)


if __name__ == "__main__":
    main()
