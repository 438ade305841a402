"""ctr.py: examples/ctr's click-through-rate model in PyTorch, on the parameter server.

    python3 ctr.py --local               # nn.EmbeddingBag in this process: the reference
    edl run --np 2 --ps 2 -- python3 ctr.py     # 2 workers, 2 servers (this script in both roles)

Logistic regression plus embeddings over 13 dense and 26 sparse slots (5,000 ids each,
skewed), on click data drawn from a planted model, so the best AUC and logloss are known (the
planted model's own, printed beside the learned ones). The data and the model are examples/ctr's
(examples/ctr.c): logit = bias + w . x + sum over slots of lr[id] + v . mean over slots of
emb[id]. With edl, lr and emb are edl.torch.SparseEmbedding on tables 0 (1 float) and 1 (8
floats), w, bias and v a dense table (2), all updated on the servers by Adagrad at lr 0.05
(GEO: the trainers' local SGD at lr 10 on the sparse tables); table 3 counts the job's batches,
so that workers the agent restarts for a later generation resume where the job got to. In
async mode each batch's rows are pulled ahead while the one before computes. --local trains the
same model with nn.EmbeddingBag (sparse gradients) and torch's Adagrad, with the same per-batch
semantics: each id's gradients summed over the batch, one Adagrad update per id.

Roles come from the environment, as Paddle's launchers and edl's agent set them (edl.fleet):
TRAINING_ROLE=PSERVER serves (edl-ps's server, in this process); TRAINER trains its share of
the batches (batch b goes to worker b mod PADDLE_TRAINERS_NUM) in the mode of --mode, else
EDL_PS_MODE (async by default), and worker 0 evaluates the servers' model once every worker is
done. It prints one line like examples/ctr's:
    ctr.py: async, 1 workers, 1 servers: test AUC 0.7491 logloss 0.5455 (the planted model:
    AUC 0.8350 logloss 0.4461); 61234 examples/s per trainer
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

import edl.fleet as fleet
import edl.ps as ps
from edl.torch import SparseEmbedding

NDENSE, NSLOT, EMB, VOCAB = 13, 26, 8, 5000
NPARAM = NDENSE + 1 + EMB  # the dense table: w, bias, v
T_LR, T_EMB, T_DENSE, T_PROGRESS = 0, 1, 2, 3
M64 = (1 << 64) - 1


# ---- the data: examples/ctr's planted model ---------------------------------------------------

def mix(x):
    """splitmix64's finaliser on a uint64 array (wrapping, as in C)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xbf58476d1ce4e5b9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94d049bb133111eb)
    return x ^ (x >> np.uint64(31))


def unit(h):
    return (h >> np.uint64(40)).astype(np.float32) / np.float32(16777216.0)


def sigmoid(z):
    return np.float32(1) / (np.float32(1) + np.exp(-z))


def make_examples(seed, first, n):
    """Examples first .. first + n - 1 of the stream of seed: x (n, 13) float32, keys (n, 26)
    int64 ((slot + 1) << 32 | id), y (n,) float32, planted logits (n,)."""
    i = np.arange(first, first + n, dtype=np.uint64)
    h = mix(np.uint64(seed * 0x9e3779b97f4a7c15 & M64) + i)
    x = np.empty((n, NDENSE), np.float32)
    keys = np.empty((n, NSLOT), np.uint64)
    logit = np.full(n, -1.0, np.float32)
    for d in range(NDENSE):
        h = mix(h + np.uint64(1))
        x[:, d] = 2 * unit(h) - 1
        coef = 2 * unit(mix(np.array([seed ^ (0x1000 + d)], np.uint64)))[0] - 1
        logit += coef * x[:, d]
    for s in range(NSLOT):
        h = mix(h + np.uint64(1))
        u = unit(h)
        ids = (np.float32(VOCAB) * u * u).astype(np.uint64)
        keys[:, s] = np.uint64((s + 1) << 32) | ids
        if s % 2 == 0:
            logit += np.float32(0.6) * (2 * unit(mix(np.uint64(seed) ^ keys[:, s])) - 1)
    y = (unit(mix(h + np.uint64(7))) < sigmoid(logit)).astype(np.float32)
    return x, keys.view(np.int64), y, logit


def auc_logloss(p, y):
    """AUC (ties share their ranks' mean) and mean logloss, as examples/ctr computes them."""
    order = np.argsort(p, kind="stable")
    p, y = p[order], y[order]
    _, first, counts = np.unique(p, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based mean ranks
    pos = y.sum()
    auc = (ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))
    q = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
    return auc, float(-np.mean(np.where(y == 1, np.log(q), np.log(1 - q))))


# ---- the model ----------------------------------------------------------------------------------

class CTR(torch.nn.Module):
    """logit = bias + w . x + (sum of lr rows) + v . (mean of emb rows); lr and emb are either
    SparseEmbedding (rows on the servers) or nn.EmbeddingBag (here)."""

    def __init__(self, lr, emb):
        super().__init__()
        self.lr, self.emb = lr, emb
        self.dense = torch.nn.Parameter(torch.zeros(NPARAM))  # w, bias, v

    def forward(self, x, ids):
        w, b, v = self.dense[:NDENSE], self.dense[NDENSE], self.dense[NDENSE + 1:]
        return x @ w + b + self.lr(ids).squeeze(1) + self.emb(ids) @ v


def evaluate(model, args, who, seconds, trained):
    model.eval()
    x, keys, y, planted = make_examples(args.seed, args.examples, args.test)
    ids = torch.from_numpy(keys if args.local is None else local_ids(keys))
    p = np.empty(args.test, np.float32)
    with torch.no_grad():
        for i in range(0, args.test, 1000):
            z = model(torch.from_numpy(x[i:i + 1000]), ids[i:i + 1000])
            p[i:i + 1000] = torch.sigmoid(z).numpy()
    auc, ll = auc_logloss(p, y)
    pauc, pll = auc_logloss(sigmoid(planted), y)
    print(f"ctr.py: {who}: test AUC {auc:.4f} logloss {ll:.4f} (the planted model: AUC "
          f"{pauc:.4f} logloss {pll:.4f}); {trained / seconds:.0f} examples/s per trainer",
          flush=True)


# ---- local: nn.EmbeddingBag in this process -----------------------------------------------------

def local_ids(keys):
    """(slot + 1) << 32 | id -> slot * VOCAB + id, the local tables' rows."""
    k = keys.view(np.uint64)
    return (((k >> np.uint64(32)) - np.uint64(1)) * np.uint64(VOCAB) +
            (k & np.uint64(0xffffffff))).astype(np.int64)


def run_local(args):
    lr = torch.nn.EmbeddingBag(NSLOT * VOCAB, 1, mode="sum", sparse=True)
    emb = torch.nn.EmbeddingBag(NSLOT * VOCAB, EMB, mode="mean", sparse=True)
    with torch.no_grad():
        lr.weight.zero_()
        emb.weight.uniform_(-0.01, 0.01)
    model = CTR(lr, emb)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05, eps=1e-8)
    x, keys, y, _ = make_examples(args.seed, 0, args.examples)
    x, ids, y = torch.from_numpy(x), torch.from_numpy(local_ids(keys)), torch.from_numpy(y)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    t0, trained, b = time.monotonic(), 0, args.batch
    for _ in range(args.epochs):
        for s in range(0, args.examples - b + 1, b):
            opt.zero_grad()
            loss_fn(model(x[s:s + b], ids[s:s + b]), y[s:s + b]).backward()
            opt.step()
            trained += b
    evaluate(model, args, "local, one process (nn.EmbeddingBag)", time.monotonic() - t0, trained)


# ---- on the parameter server --------------------------------------------------------------------

def make_model(args):
    geo = fleet.mode() == "geo"
    opt = dict(optimizer="sgd", lr=10.0) if geo else dict(optimizer="adagrad", lr=0.05)
    lr = SparseEmbedding(T_LR, 1, mode="sum", init="zero", seed=11, **opt,
                         replicas=args.replicas)
    emb = SparseEmbedding(T_EMB, EMB, mode="mean", init="uniform", init_scale=0.01, seed=11,
                          **opt, replicas=args.replicas)
    dense = ps.DenseTable(T_DENSE, NPARAM, optimizer="adagrad", lr=0.05, seed=11,
                          replicas=args.replicas)
    progress = ps.DenseTable(T_PROGRESS, 1, optimizer="sgd", lr=1.0, replicas=args.replicas)
    return CTR(lr, emb), dense, progress


def first_batch(progress, total):
    """Where this worker's share begins: the job's first batch, or, when the agent restarted
    the workers for a later generation, where the job got to."""
    gen = int(os.environ.get("EDL_GENERATION", "0") or 0)
    if gen <= 1:
        return 0
    first = min(int(round(float(progress.pull(direct=True)[0]))), total)
    if first:
        print(f"ctr.py: worker {fleet.worker_index()} of {fleet.worker_num()} resumes at batch "
              f"{first} of the job's {total} (generation {gen})", flush=True)
    return first


def train(args):
    model, dense, progress = make_model(args)
    nw, wi, b = fleet.worker_num(), fleet.worker_index(), args.batch
    total = args.epochs * (args.examples // b)
    first = first_batch(progress, total)
    steps = (total - first) // nw
    x, keys, y, _ = make_examples(args.seed, 0, args.examples)
    x, ids, y = torch.from_numpy(x), torch.from_numpy(keys), torch.from_numpy(y)

    def start(step):  # the job's batches from `first` on, dealt round robin to the workers
        return ((first + step * nw + wi) * b) % args.examples

    loss_fn = torch.nn.BCEWithLogitsLoss()
    minus_one = torch.tensor([-1.0])
    t0 = time.monotonic()
    for step in range(steps):
        s = start(step)
        dense.pull(model.dense.data)
        logit = model(x[s:s + b], ids[s:s + b])  # takes the rows pulled ahead, if any
        if step + 1 < steps:  # async: the next batch's rows come while this one computes
            n = start(step + 1)
            model.lr.prefetch(ids[n:n + b])
            model.emb.prefetch(ids[n:n + b])
        model.dense.grad = None
        loss_fn(logit, y[s:s + b]).backward()  # pushes the rows' gradients
        dense.push(model.dense.grad)
        progress.push(minus_one)  # one more batch trained, applied with its gradients
        fleet.step()
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
    fleet.worker().flush()
    seconds = time.monotonic() - t0
    fleet.barrier_worker()  # every worker's updates are in
    if wi == 0:
        done = int(round(float(progress.pull(direct=True)[0])))
        print(f"ctr.py: the job trained {done} batches of its {total}", flush=True)
        dense.pull(model.dense.data, direct=True)
        who = (f"{fleet.mode()}, {nw} workers, {fleet.server_num()} servers "
               f"(edl.torch.SparseEmbedding)")
        evaluate(model, args, who, seconds, steps * b)


def main():
    if args.local:
        return run_local(args)
    strategy = fleet.DistributedStrategy(args.mode) if args.mode else None
    fleet.init(strategy=strategy)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0
    fleet.init_worker()
    try:
        train(args)
    finally:
        fleet.stop_worker()
    return 0


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local", action="store_const", const=True, default=None,
                   help="train with nn.EmbeddingBag in this process, no servers")
    p.add_argument("--examples", type=int, default=200000)
    p.add_argument("--test", type=int, default=50000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mode", choices=ps.MODES, help="the strategy's mode (else EDL_PS_MODE)")
    p.add_argument("--replicas", type=int, default=int(os.environ.get("EDL_PS_REPLICAS", "1")),
                   help="servers that apply each update (1-3; EDL_PS_REPLICAS)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch's intra-op threads (1: one trainer thread, as examples/ctr)")
    p.add_argument("--step-ms", type=float, default=0, help="sleep after each step (tests)")
    a = p.parse_args()
    if a.examples < a.batch or a.test < 2 or a.batch < 1 or not 1 <= a.replicas <= 3:
        p.error("want examples >= batch >= 1, test >= 2, replicas 1..3")
    return a


if __name__ == "__main__":
    args = parse()
    torch.set_num_threads(args.torch_threads)
    sys.exit(main())
