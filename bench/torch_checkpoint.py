"""torch_checkpoint.py: edl.checkpoint against torch.save for a PyTorch state dict, in one run
on the same disk.

    sync    edl.checkpoint.save(state, step, file://DIR) (committed through a real etcd)
            against torch.save(state, FILE) + fsync of the file: seconds and GB/s (goal:
            edl >= 2x)
    load    edl.checkpoint.load(file://DIR) against torch.load(FILE) of the same state, warm
            (the files in the page cache; goal: edl >= 2x) and cold (both evicted first with
            posix_fadvise DONTNEED; goal: edl at least the disk's speed, which
            dd iflag=direct of torch's file measures in the same run)
    async   a training loop of fixed steps (compute of --step-ms each) that queues
            edl.checkpoint.save_async every --every steps: the share of the loop's time spent
            blocked in checkpointing (copying, then waiting for the previous save), with the
            snapshot copied before save_async returns and in the background (goal: <= 5 %)

Each figure is the median of --trials runs, edl's and the other's alternated, with the
spread (lowest-highest) in brackets.

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


def spread(xs):
    """'median s [lowest-highest]' of a list of seconds."""
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def alternate(trials, runs, before=None):
    """{name: [seconds]} of each run in runs ({name: fn}), called in turn trials times;
    before(name) (not timed) runs before each."""
    times = {name: [] for name in runs}
    for _ in range(trials):
        for name, fn in runs.items():
            if before:
                before(name)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def sync_trials(args, sd, workdir, torch, ckpt):
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    path, step = os.path.join(workdir, "torch-save.pt"), [0]

    def torch_save():
        torch.save(sd, path)
        fsync_file(path)
        os.unlink(path)

    def edl_save():
        step[0] += 1
        ckpt.save(sd, step[0], "file://" + os.path.join(workdir, "edl"))

    t = alternate(args.trials, {"torch": torch_save, "edl": edl_save})
    te, tt = statistics.median(t["edl"]), statistics.median(t["torch"])
    gb = nbytes / 1e9
    print(f"sync: {gb:.2f} GB state dict: edl.checkpoint.save {spread(t['edl'])} "
          f"({gb / te:.2f} GB/s), torch.save + fsync {spread(t['torch'])} ({gb / tt:.2f} GB/s): "
          f"edl {tt / te:.2f}x (goal >= 2x; medians of {args.trials}, alternated)", flush=True)


def evict(top):
    """Drop top's files (a file or a directory's) from the page cache: they are clean, so
    DONTNEED lets them go and the next read comes from the disk."""
    paths = [top] if os.path.isfile(top) else [os.path.join(d, f) for d, _, fs in os.walk(top)
                                                for f in fs]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def direct_read(path):
    """Read path with O_DIRECT (dd iflag=direct): the disk's own speed, no page cache."""
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def load_trials(args, sd, workdir, torch, ckpt):
    gb = sum(t.numel() * t.element_size() for t in sd.values()) / 1e9
    path, url = os.path.join(workdir, "torch-load.pt"), "file://" + os.path.join(workdir, "edl")
    torch.save(sd, path)
    ckpt.save(sd, 500, url)  # after the sync rows' steps: one job's steps only grow
    edl_dir = os.path.join(workdir, "edl")
    warm = {"torch": lambda: torch.load(path), "edl": lambda: ckpt.load(url)}
    for fn in warm.values():  # the files into the page cache, the code paths run once
        fn()
    t = alternate(args.trials, warm)
    print(f"load warm: {gb:.2f} GB: edl.checkpoint.load {spread(t['edl'])} "
          f"({gb / statistics.median(t['edl']):.2f} GB/s), torch.load {spread(t['torch'])}: edl "
          f"{statistics.median(t['torch']) / statistics.median(t['edl']):.2f}x (goal >= 2x)",
          flush=True)
    cold = {"torch": lambda: torch.load(path), "edl": lambda: ckpt.load(url),
            "dd": lambda: direct_read(path)}
    t = alternate(args.trials, cold, lambda name: (evict(path), evict(edl_dir)))
    disk = gb / statistics.median(t["dd"])
    edl = gb / statistics.median(t["edl"])
    print(f"load cold: {gb:.2f} GB: edl.checkpoint.load {spread(t['edl'])} ({edl:.2f} GB/s), "
          f"torch.load {spread(t['torch'])} "
          f"({gb / statistics.median(t['torch']):.2f} GB/s), disk (dd iflag=direct) "
          f"{spread(t['dd'])} ({disk:.2f} GB/s): edl at {100 * edl / disk:.0f} % of the disk "
          f"(goal >= 100 %)", flush=True)
    os.unlink(path)


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
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--only", default="save,load,async", help="which figures: save,load,async")
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
        if "save" in args.only:
            sync_trials(args, sd, workdir, torch, ckpt)
        if "load" in args.only:
            load_trials(args, sd, workdir, torch, ckpt)
        if "async" not in args.only:
            return 0
        async_loop(args, sd, workdir, torch, ckpt, False)
        async_loop(args, sd, workdir, torch, ckpt, True)
    finally:
        etcd.send_signal(signal.SIGTERM)
        etcd.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
