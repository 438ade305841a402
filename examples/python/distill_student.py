"""distill_student.py: a distillation student in PyTorch that learns from examples/distill's C
teachers through edl.distill.Reader (libedldistill: batches in flight across the teachers,
sent elsewhere when one fails, each delivered once, in order).

    build/examples/distill --role teacher --port 8501 &
    build/examples/distill --role teacher --port 8502 &
    python3 distill_student.py --teachers http://127.0.0.1:8501,http://127.0.0.1:8502

    # under edl: one student, teachers of the job in service mlp (this script runs the C teacher
    # in the teachers' pods: EDL_ROLE_NAME=teacher)
    edl run --np 1 --teachers 2 --service mlp -- python3 distill_student.py

The data are examples/elastic_mlp's (examples/mlp.h: 16 inputs uniform in [-1, 1], 4 classes
from a fixed random linear map, 4,096 training and 1,024 test samples), drawn here with the
same generator. The teachers serve mlp.h's MLP; the student is a softmax regression (16 -> 4)
trained by SGD on the teachers' soft labels, batch after batch in order, as examples/distill's
student; beside it the same student trained on the true labels (the reference without
teachers). It states what it takes (4 columns of probabilities: cols=4, max_abs=1), so a
teacher answering anything else is a bad reply and its batch goes to another. Prints both
accuracies and the reader's counters, and exits 1 when a batch was lost or came twice.
"""
import argparse
import os
import shutil
import sys
import time

import numpy as np
import torch

import edl.distill

D, C, NTRAIN, NTEST = 16, 4, 4096, 1024
M64 = (1 << 64) - 1


def make_data():
    """examples/mlp.h's make_data: the same xorshift64 stream, the same floats."""
    state = 20261122

    def uniform():
        nonlocal state
        state ^= (state << 13) & M64
        state ^= state >> 7
        state ^= (state << 17) & M64
        return (state >> 40) * (2.0 / 16777216.0) - 1.0

    teacher = np.array([[uniform() for _ in range(D)] for _ in range(C)], np.float32)
    x = np.array([[uniform() for _ in range(D)] for _ in range(NTRAIN + NTEST)], np.float32)
    y = np.argmax(x @ teacher.T, axis=1)
    return x, y


def batches(x, rows, epochs):
    """Batch k: `rows` consecutive training samples from k * rows on (wrapping), as
    examples/distill's student takes them; each with its index."""
    for k in range(epochs * (NTRAIN // rows)):
        idx = (k * rows + np.arange(rows)) % NTRAIN
        yield torch.from_numpy(x[idx]), k


def step(model, opt, x, q):
    """One SGD step of softmax regression towards the distributions q (rows x C)."""
    opt.zero_grad()
    loss = -(q * torch.log_softmax(model(x), dim=1)).sum(1).mean()
    loss.backward()
    opt.step()


def accuracy(model, x, y):
    with torch.no_grad():
        got = model(torch.from_numpy(x[NTRAIN:])).argmax(1).numpy()
    return float((got == y[NTRAIN:]).mean())


def student(lr):
    torch.manual_seed(0)
    m = torch.nn.Linear(D, C)
    with torch.no_grad():
        m.weight.zero_()
        m.bias.zero_()
    return m, torch.optim.SGD(m.parameters(), lr=lr)


def teacher_role(args):
    """In a teacher's pod (EDL_ROLE_NAME=teacher): become examples/distill's C teacher."""
    exe = args.teacher_bin or shutil.which("distill") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "../../build/examples/distill")
    os.execv(exe, [exe, "--role", "teacher"])


def main(args):
    if os.environ.get("EDL_ROLE_NAME") == "teacher":
        teacher_role(args)
    x, y = make_data()
    remote, ropt = student(args.lr)
    local, lopt = student(args.lr)
    reader = edl.distill.Reader(args.service, batches(x, args.batch, args.epochs),
                                teachers=args.teachers, cols=C, max_abs=1, ordered=True,
                                format=args.format, in_flight=args.in_flight)
    seen, t0 = set(), time.monotonic()
    expected = 0
    for (xb, k), soft in reader:
        if k in seen or k != expected:  # never: each batch once, in order
            print(f"distill_student: batch {k} came out of turn (expected {expected})",
                  file=sys.stderr)
            return 1
        seen.add(k)
        expected += 1
        step(remote, ropt, xb, soft)
        step(local, lopt, xb, torch.nn.functional.one_hot(torch.from_numpy(
            y[(k * args.batch + np.arange(args.batch)) % NTRAIN]), C).float())
    secs = time.monotonic() - t0
    st = reader.stats
    reader.close()
    print(f"distill_student: test accuracy {accuracy(remote, x, y):.4f} on the teachers' "
          f"labels, {accuracy(local, x, y):.4f} on the true labels (reference)", flush=True)
    print(f"distill_student: {st['delivered']} batches in {secs:.1f} s, retried "
          f"{st['retried']}, timeouts {st['timeouts']}, connection errors {st['conn_errors']}, "
          f"HTTP errors {st['http_errors']}, bad replies {st['bad_replies']}, lost "
          f"{st['submitted'] - st['delivered'] + st['failed']}", flush=True)
    return 0 if len(seen) == args.epochs * (NTRAIN // args.batch) else 1


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teachers", help="http://host:port,... (else $EDL_TEACHERS, or --service)")
    p.add_argument("--service", help="the teachers' service (else $EDL_SERVICE; under edl)")
    p.add_argument("--format", choices=("binary", "json"), default="binary")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--in-flight", type=int, default=4, help="batches in flight per teacher")
    p.add_argument("--lr", type=float, default=0.5, help="the student's learning rate")
    p.add_argument("--teacher-bin", help="examples/distill, for the teacher role (else "
                   "distill on PATH, else the build tree's)")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(main(parse()))
