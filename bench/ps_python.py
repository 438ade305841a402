"""ps_python.py: bench/ps's Python path. The parameter server's sparse pull and push from Python
(edl.ps.SparseTable on numpy arrays) against the C client in the same run, and
examples/python/ctr.py's examples/s per trainer with the servers in async mode against its local
nn.EmbeddingBag version.

    python3 bench/ps_python.py [--build build] [--seconds 1] [--rounds 6] [--batch 10000]
                               [--keys 1048576] [--dim 16] [--examples 200000] [--no-ctr]
                               [--quick]

Keys/s: one edl-ps process (the build tree's, 127.0.0.1, 2 loops) and one client in this
process, as bench/ps's 1 x 1: batches of --batch random keys of a --keys key space (every row
made by a warm-up pull first), rows of --dim floats, SGD. The C client's figure is the
extension's own loop of edl_ps_pull_sparse / edl_ps_push_sparse on the same client, the same
batches and buffers (PsWorker.time_sparse); the Python figure is SparseTable.pull(keys, out) /
push(keys, grads) called from a Python loop. They alternate, --rounds tries each, and the best
and the median of each are printed with their ratios (goal: 0.9 at batches of 10,000 keys).

Examples/s: examples/python/ctr.py --local (nn.EmbeddingBag, torch's Adagrad, one thread), then
ctr.py with one server and one worker in async mode (processes with Paddle's variables, the
server being ctr.py's own edl.fleet.run_server); each prints examples/s per trainer, and the
ratio is printed (goal: 0.5). Not a test: docs/python.md has the figures of a run.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secret_file(d):
    path = os.path.join(d, "job.secret")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(32))
    return path


def python_rate(table, batches, buf, push, seconds):
    """keys/s of SparseTable.pull / push called from this loop for about `seconds`."""
    call = table.push if push else table.pull
    n, t0 = 0, time.perf_counter()
    while True:
        for keys in batches:
            call(keys, buf)
            n += len(keys)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return n / elapsed


def c_rate(worker, table, keys, batch, buf, push, seconds):
    calls, elapsed = worker._w.time_sparse(table.id, push, keys.ctypes.data, keys.nbytes, batch,
                                           buf.ctypes.data, buf.nbytes, seconds)
    return calls * batch / elapsed


def sparse(args, build, tmp):
    import edl
    import edl.ps as ps
    port = free_port()
    secret = secret_file(tmp)
    server = subprocess.Popen([os.path.join(build, "bin", "edl-ps"), "--port", str(port),
                               "--job", "bench", "--secret-file", secret, "--threads", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        edl._edl.wait_listening("127.0.0.1", port, 20000)
        w = ps.Worker([f"127.0.0.1:{port}"], mode=None, job="bench", secret_file=secret)
        t = ps.SparseTable(0, args.dim, worker=w, optimizer="sgd", lr=0.01)
        rng = np.random.default_rng(1)
        space = rng.integers(0, 2**62, size=args.keys, dtype=np.uint64)
        rows = np.empty((args.batch, args.dim), np.float32)
        for i in range(0, args.keys, args.batch):  # every row made first
            t.pull(space[i:i + args.batch], rows[:len(space[i:i + args.batch])])
        keys = space[rng.integers(0, args.keys, size=args.batch * 64)]
        batches = [keys[i:i + args.batch] for i in range(0, len(keys), args.batch)]
        grads = np.full((args.batch, args.dim), 1e-3, np.float32)
        print(f"what         batch   C client          Python (edl.ps)   of C   (1 x 1, rows "
              f"of {args.dim} floats; best, then median, of {args.rounds} x {args.seconds} s "
              f"each, alternating)")
        for push, name, buf in ((False, "sparse pull", rows), (True, "sparse push", grads)):
            c, py = [], []
            for _ in range(args.rounds):
                c.append(c_rate(w, t, keys, args.batch, buf, push, args.seconds))
                py.append(python_rate(t, batches, buf, push, args.seconds))
            for what, a, b in (("best", max(c), max(py)),
                               ("median", np.median(c), np.median(py))):
                print(f"{name:12} {args.batch:6} {a / 1e6:7.2f} M keys/s   {b / 1e6:7.2f} M keys/s"
                      f"   {b / a:5.2f}  ({what})", flush=True)
        w.close()
    finally:
        server.terminate()
        server.wait()


RATE = re.compile(r"test AUC (\d\.\d+).*; (\d+) examples/s per trainer")


def ctr(args, build, tmp):
    script = os.path.join(SOURCE, "examples", "python", "ctr.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), EDL_JOB_ID="bench",
               EDL_JOB_SECRET_FILE=secret_file(tempfile.mkdtemp(dir=tmp)))
    common = ["--examples", str(args.examples), "--test", "20000"]

    def rate(text, who):
        m = RATE.search(text)
        if not m:
            sys.exit(f"ps_python: {who}: no figure in its output:\n{text[-2000:]}")
        return float(m.group(1)), int(m.group(2))

    local = subprocess.run([sys.executable, script, "--local", *common], env=env,
                           capture_output=True, text=True, timeout=900)
    auc_l, ex_l = rate(local.stdout + local.stderr, "local")
    port = free_port()
    penv = dict(env, PADDLE_PSERVERS_IP_PORT_LIST=f"127.0.0.1:{port}", PADDLE_TRAINERS_NUM="1",
                EDL_PS_MODE="async")
    server = subprocess.Popen([sys.executable, script, *common], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env=dict(penv, TRAINING_ROLE="PSERVER", PADDLE_PORT=str(port)))
    try:
        import edl
        edl._edl.wait_listening("127.0.0.1", port, 60000)
        worker = subprocess.run([sys.executable, script, *common], capture_output=True,
                                text=True, timeout=900,
                                env=dict(penv, TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="0"))
    finally:
        server.terminate()
        server.wait()
    auc_a, ex_a = rate(worker.stdout + worker.stderr, "async")
    print(f"modes: examples/python/ctr.py, {args.examples} examples, batches of 256, one "
          f"torch thread")
    print("mode       W x S      AUC   examples/s/trainer  of local")
    print(f"local      -       {auc_l:.4f}  {ex_l:18d}      1.00   (nn.EmbeddingBag, "
          f"sparse Adagrad)")
    print(f"async      1x1     {auc_a:.4f}  {ex_a:18d}  {ex_a / ex_l:8.2f}   "
          f"(edl.torch.SparseEmbedding, rows pulled ahead)", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(SOURCE, "build"))
    p.add_argument("--seconds", type=float, default=1.0, help="one try of a path")
    p.add_argument("--rounds", type=int, default=6, help="tries of each path, alternating")
    p.add_argument("--batch", type=int, default=10000)
    p.add_argument("--keys", type=int, default=1 << 20)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--examples", type=int, default=200000)
    p.add_argument("--no-ctr", action="store_true", help="skip examples/python/ctr.py")
    p.add_argument("--quick", action="store_true", help="3 x 0.5 s a path, 50,000 examples")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.examples = 0.5, 3, 50000
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    with tempfile.TemporaryDirectory(prefix="edl-bench-") as tmp:
        sparse(args, build, tmp)
        if not args.no_ctr:
            ctr(args, build, tmp)


if __name__ == "__main__":
    main()
