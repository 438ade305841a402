"""torch_checkpoint.py: edl.checkpoint against torch.save for a PyTorch state dict, in one run
on the same disk.

    sync    edl.checkpoint.save(state, step, file://DIR) (committed through a real etcd)
            against torch.save(state, FILE) + fsync of the file: seconds and GB/s, median of
            the trials (goal: edl >= 2x)
    async   a training loop of fixed steps (compute of --step-ms each) that queues
            edl.checkpoint.save_async every --every steps: the share of the loop's time spent
            blocked in checkpointing (copying, then waiting for the previous save), with the
            snapshot copied before save_async returns and in the background (goal: <= 5 %)

    python3 bench/torch_checkpoint.py [--gib 1] [--trials 3] [--dir /var/tmp] [--build build]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(workdir):
    url, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(["etcd", "--data-dir", os.path.join(workdir, "etcd"),
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", f"default={peer}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise SystemExit("bench torch_checkpoint: etcd did not start")


def state_dict(gib, torch):
    n = 16
    per = int(gib * (1 << 30)) // n // 4
    return {f"layer{i}.weight": torch.randn(per) for i in range(n)}


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def sync_trials(args, sd, workdir, torch, ckpt):
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    edl_s, torch_s = [], []
    for trial in range(args.trials):
        path = os.path.join(workdir, f"torch-{trial}.pt")
        t0 = time.perf_counter()
        torch.save(sd, path)
        fsync_file(path)
        torch_s.append(time.perf_counter() - t0)
        os.unlink(path)
        t0 = time.perf_counter()
        ckpt.save(sd, trial + 1, "file://" + os.path.join(workdir, "edl"))
        edl_s.append(time.perf_counter() - t0)
    te, tt = statistics.median(edl_s), statistics.median(torch_s)
    gb = nbytes / 1e9
    print(f"sync: {gb:.2f} GB state dict: edl.checkpoint.save {te:.2f} s ({gb / te:.2f} GB/s), "
          f"torch.save + fsync {tt:.2f} s ({gb / tt:.2f} GB/s): edl {tt / te:.2f}x "
          f"(goal >= 2x; medians of {args.trials})", flush=True)


def async_loop(args, sd, workdir, torch, ckpt, background):
    url = "file://" + os.path.join(workdir, f"async-{int(background)}")
    ckpt.reserve(url, sd, snapshot_in_background=background)  # once, before training
    blocked, pending = 0.0, None
    t_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        if pending is not None and background:  # before the optimizer writes the weights
            t0 = time.perf_counter()
            pending.snapshot_wait()
            blocked += time.perf_counter() - t0
        time.sleep(args.step_ms / 1000)  # forward, backward, optimizer
        if step % args.every == 0:
            t0 = time.perf_counter()
            if pending is not None:
                pending.wait()  # the previous one had a whole interval to finish
            # (one job keeps one series of checkpoints, whose steps only grow)
            pending = ckpt.save_async(sd, 1000 + step + 1000 * background, url,
                                      snapshot_in_background=background)
            blocked += time.perf_counter() - t0
    if pending is not None:
        pending.wait()
    total = time.perf_counter() - t_start
    how = "snapshot in the background" if background else "snapshot copied in save_async"
    print(f"async ({how}): {args.steps} steps of {args.step_ms:.0f} ms, a save every "
          f"{args.every}: blocked {blocked:.2f} s of {total:.2f} s = {100 * blocked / total:.1f} % "
          f"(goal <= 5 %)", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-ms", type=float, default=200)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--dir", default="/var/tmp", help="the disk both write to")
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    import edl.checkpoint as ckpt
    workdir = tempfile.mkdtemp(prefix="edl-bench-ckpt-", dir=args.dir)
    etcd, url = start_etcd(workdir)
    os.environ.update(EDL_JOB_ID="bench-ckpt", EDL_ETCD_ENDPOINTS=url)
    try:
        sd = state_dict(args.gib, torch)
        sync_trials(args, sd, workdir, torch, ckpt)
        async_loop(args, sd, workdir, torch, ckpt, False)
        async_loop(args, sd, workdir, torch, ckpt, True)
    finally:
        etcd.send_signal(signal.SIGTERM)
        etcd.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
