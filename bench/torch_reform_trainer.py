"""torch_reform_trainer.py: the trainer that bench/torch_reform.py runs under `edl run`.

Every step allreduces a 1 MiB tensor; after each (re)formation of its world it prints one line
{"first_allreduce": T, "generation": G, "world": W, "pid": P} with the wall-clock time T at
which the new world's first allreduce returned. Two ways, the same work:

  --mode inprocess   edl.torch: the process group re-formed in place (State, elastic)
  --mode restart     unmodified torch: init_process_group from the torchrun environment the
                     agent sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); every generation
                     is a new process
"""
import argparse
import faulthandler
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def report(generation, world):
    print(json.dumps({"first_allreduce": time.time(), "generation": generation, "world": world,
                      "pid": os.getpid()}), flush=True)


def restart_mode(args):
    dist.init_process_group("gloo")
    t = torch.ones(args.floats)
    dist.all_reduce(t)
    report(int(os.environ.get("EDL_GENERATION", "0")), dist.get_world_size())
    for _ in range(args.steps):
        dist.all_reduce(t)
        time.sleep(args.step_ms / 1000)


def inprocess_mode(args):
    import edl.torch as et

    state = et.State(step=0)
    seen = set()

    @et.elastic
    def train(state):
        t = torch.ones(args.floats)
        while state.step < args.steps:
            dist.all_reduce(t)
            w = et.world()
            if w.generation not in seen:
                seen.add(w.generation)
                report(w.generation, w.world_size)
            state.step += 1
            state.commit()
            time.sleep(args.step_ms / 1000)

    train(state)


def main():
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where is it? kill -USR1 PID
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["inprocess", "restart"], required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-ms", type=float, default=20)
    p.add_argument("--floats", type=int, default=1 << 18, help="allreduce size (1 MiB)")
    args = p.parse_args()
    (inprocess_mode if args.mode == "inprocess" else restart_mode)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
