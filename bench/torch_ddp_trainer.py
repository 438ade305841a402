"""torch_ddp_trainer.py: bench/torch_ddp.py's trainer. One MLP (1024 -> 2048 -> 1024 -> 10,
about 4.2 million parameters), a batch of 64 random samples per rank and step, SGD; after
--warmup steps it times --steps steps and prints the median step time:

    bench-step mode <mode> rank <r> world <n> params <count> ms <median>

--mode torchrun: torch's DDP on init_process_group("env://"); edl_ddp:
edl.torch.DistributedDataParallel with a state.commit() every --commit-every steps; allreduce:
the plain model and edl.torch.allreduce_gradients (averaged) after backward, commits alike."""
import argparse
import statistics
import time

import torch


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10))


def steps(net, opt, args, after_backward, after_step):
    x, y = torch.randn(64, 1024), torch.randint(0, 10, (64,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        after_backward()
        opt.step()
        after_step(i)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("torchrun", "edl_ddp", "allreduce"), required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--commit-every", type=int, default=1, help="steps per state.commit()")
    args = p.parse_args()
    torch.set_num_threads(1)  # 2 ranks on a small machine: no oversubscription
    m = model()
    params = sum(t.numel() for t in m.parameters())
    if args.mode == "torchrun":
        import torch.distributed as dist
        dist.init_process_group("gloo")
        net = torch.nn.parallel.DistributedDataParallel(m)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        ms = steps(net, opt, args, lambda: None, lambda i: None)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        import edl.torch as et
        net = et.DistributedDataParallel(m) if args.mode == "edl_ddp" else m
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        state = et.State(model=m, optimizer=opt)
        reduce = (lambda: None) if args.mode == "edl_ddp" else (
            lambda: et.allreduce_gradients(m))

        @et.elastic(state)
        def train():
            return steps(net, opt, args, reduce,
                         lambda i: (i + 1) % args.commit_every or state.commit())

        ms = train()
        rank, world = et.world().rank, et.world().world_size
    print(f"bench-step mode {args.mode} rank {rank} world {world} params {params} ms {ms:.3f}",
          flush=True)


if __name__ == "__main__":
    main()
