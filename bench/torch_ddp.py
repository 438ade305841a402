"""torch_ddp.py: the step time of DistributedDataParallel under edl against torch's own, no
churn: an MLP of about 4.2 million parameters trained by 2 ranks on this machine (gloo, CPU;
nccl where CUDA is available), three ways in one run:

- torchrun: torch's DDP in processes started with torchrun's environment (RANK, WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT; torchrun 1.13 itself fails on Python 3.11 here, in its argument
  parsing, so the bench sets the environment it would set) and init_process_group("env://");
- edl_ddp: edl.torch.DistributedDataParallel under `edl run` (InProcess), a state.commit()
  every --commit-every steps (a copy of the model and optimizer in memory, and a one-integer
  allreduce that agrees on the generation: edl's cost);
- allreduce: the same under `edl run` with edl.torch.allreduce_gradients after backward
  (one flat allreduce, no overlap with the backward pass).

Each prints one line: the median step time over --steps timed steps after --warmup, the
last rank's, and edl's overhead against torchrun. Goal (issue 40): edl_ddp within 5 %.

    python3 bench/torch_ddp.py [--build build] [--steps 60] [--warmup 10] [--trials 3] [--commit-every 1]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "torch_ddp_trainer.py")
LINE = re.compile(r"bench-step mode (\S+) rank (\d+) world (\d+) params (\d+) ms ([\d.]+)")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, env):
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, TRAINER, "--mode", "torchrun", *trainer_args(args)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                       LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    return "".join(p.communicate(timeout=600)[0] for p in procs)


def edl_run(args, env, mode):
    job = f"bench-ddp-{mode.replace('_', '-')}-{os.getpid()}"
    done = subprocess.run([os.path.join(args.build, "bin", "edl"), "run", "--job", job, "--np",
                           "2", "--replicas", "2", "--elastic-mode", "inprocess", "--",
                           sys.executable, TRAINER, "--mode", mode, *trainer_args(args)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    if done.returncode:
        sys.exit(f"torch_ddp: `edl run` of {mode} exited {done.returncode}:\n"
                 f"{done.stdout[-3000:]}")
    return done.stdout


def trainer_args(args):
    return ["--steps", str(args.steps), "--warmup", str(args.warmup), "--commit-every",
            str(args.commit_every)]


def step_ms(out, mode):
    found = [m for m in LINE.finditer(out) if m[1] == mode]
    if len(found) != 2:
        sys.exit(f"torch_ddp: {mode}: expected 2 ranks' lines, got {len(found)}:\n{out[-3000:]}")
    return max(float(m[5]) for m in found), int(found[0][4])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--commit-every", type=int, default=1,
                   help="steps per state.commit() (each commit copies the model and optimizer)")
    p.add_argument("--trials", type=int, default=3, help="runs of each mode, interleaved")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"))
    times = {"torchrun": [], "edl_ddp": [], "allreduce": []}
    with tempfile.TemporaryDirectory():
        for _ in range(args.trials):  # interleaved, so a load change hits every mode alike
            for mode in times:
                out = torchrun(args, env) if mode == "torchrun" else edl_run(args, env, mode)
                ms, params = step_ms(out, mode)
                times[mode].append(ms)
    base = statistics.median(times["torchrun"])
    for mode, ms in times.items():
        med = statistics.median(ms)
        print(f"torch_ddp mode={mode} ranks=2 params={params / 1e6:.1f}M step_ms={med:.2f} "
              f"min={min(ms):.2f} max={max(ms):.2f} trials={len(ms)} "
              f"vs_torchrun={100 * (med / base - 1):+.1f}%", flush=True)


if __name__ == "__main__":
    main()
