"""edl.ps's four modes from Python, each against a reference computed here, as
tests/test_ps_modes.c does in C: sync (every trainer's gradients summed and applied once per
step, Adam on the servers), async and half_async (every gradient applied exactly once: SGD is
linear, so the rows are the initial ones minus lr times the sum of every gradient, whatever the
order and the merging), GEO (the local copies and the servers' rows are the protocol played out
on arrays), and SparseEmbedding's forward and backward against nn.EmbeddingBag's. Trainers are
threads of this process, each with its own edl.ps.Worker (the GIL is released in every call);
the servers are edl-ps processes."""
import threading

import numpy as np
import pytest

import edl.ps as ps

POOL, DIM, DENSE, LR = 64, 4, 1000, np.float32(0.05)
KEYS = ((np.arange(POOL, dtype=np.uint64) * np.uint64(0x9e3779b97f4a7c15)) +
        np.uint64(17))


def grad(tr, step, j, d):
    """A gradient that depends on (trainer, step, position, column) only (j, d: arrays)."""
    return ((((tr + 1) * 31 + (step + 2) * 17 + (j + 3) * 7 + (d + 1) * 5) % 23 - 11) /
            11).astype(np.float32)


def batch(tr, step):
    """16 keys of the pool (the last repeats the first) and their gradients (16, DIM)."""
    j = np.arange(16)
    idx = (tr * 7 + step * 3 + j * 5) % POOL
    idx[15] = idx[0]
    return idx, grad(tr, step, j[:, None], np.arange(DIM)[None, :])


def dense_grad(tr, step):
    return grad(tr, step, np.arange(DENSE), 0)


def near(got, want, what):
    bad = np.abs(got - want) > 2e-5 * (1 + np.abs(want))
    assert not bad.any(), (f"{what}: {got[bad][:4]} where the reference has {want[bad][:4]} "
                           f"({bad.sum()} floats differ)")


def tables(worker, optimizer, geo=None):
    sp = ps.SparseTable(0, DIM, worker=worker, optimizer=optimizer, lr=float(LR), shards=64,
                        geo_trainers=geo)
    dn = ps.DenseTable(1, DENSE, worker=worker, optimizer="sgd", lr=float(LR), shards=64,
                       init="uniform")
    return sp, dn


def initial(eps, optimizer, geo=None):
    """The rows and dense values before any update (a function of seed, key and column)."""
    with ps.Worker(eps, mode=None, job="pyjob") as w:
        sp, dn = tables(w, optimizer, geo)
        return sp.pull(KEYS), dn.pull()


def run_threads(fns):
    errors = []

    def guard(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guard, args=(f,)) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a trainer thread hangs"
    if errors:
        raise errors[0]


# ---- sync ------------------------------------------------------------------------------------

def adam(w, m, v, p, g, beta1=np.float32(0.9), beta2=np.float32(0.999), eps=np.float32(1e-8)):
    p[0] *= beta1
    p[1] *= beta2
    lr_t = LR * np.sqrt(np.float32(1) - p[1]) / (np.float32(1) - p[0])
    m[:] = beta1 * m + (np.float32(1) - beta1) * g
    v[:] = beta2 * v + (np.float32(1) - beta2) * g * g
    w -= lr_t * m / (np.sqrt(v) + eps)


def sync_reference(w0, d0, trainers, steps):
    """The rows after each step: the trainers' gradients summed per key, one Adam update a key;
    the dense values after the last step (SGD)."""
    w, dense = w0.copy(), d0.copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    p = np.ones((POOL, 2), np.float32)
    after = []
    for s in range(steps):
        total, touched = np.zeros_like(w), np.zeros(POOL, bool)
        for tr in range(trainers):
            idx, g = batch(tr, s)
            np.add.at(total, idx, g)
            touched[idx] = True
            dense -= LR * dense_grad(tr, s)
        for i in np.nonzero(touched)[0]:
            adam(w[i], m[i], v[i], p[i], total[i])
        after.append(w.copy())
    return after, dense


def test_sync_applies_the_sum_of_every_trainers_gradients_once_a_step(ps_servers):
    eps = ps_servers(2)
    w0, d0 = initial(eps, "adam")
    steps, seen = 6, {}

    def trainer(tr):
        with ps.Worker(eps, mode="sync", trainer_id=tr, trainers=3, job="pyjob") as w:
            sp, dn = tables(w, "adam")
            seen[tr] = []
            for s in range(steps):
                idx, g = batch(tr, s)
                sp.push(KEYS[idx], g)
                dn.push(dense_grad(tr, s))
                w.step()
                seen[tr].append(sp.pull(KEYS, direct=True))

    run_threads([lambda tr=tr: trainer(tr) for tr in range(3)])
    after, dense = sync_reference(w0, d0, 3, steps)
    for tr in range(3):
        for s in range(steps):
            near(seen[tr][s], after[s], f"trainer {tr} after step {s}")
    _, got = initial(eps, "adam")
    near(got, dense, "dense")


# ---- async and half_async --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["async", "half_async"])
def test_every_gradient_is_applied_exactly_once(ps_servers, mode):
    eps = ps_servers(2)
    w0, d0 = initial(eps, "sgd")
    workers = [ps.Worker(eps, mode=mode, trainer_id=0, trainers=2, threads=2, job="pyjob"),
               ps.Worker(eps, mode=mode, trainer_id=1, trainers=2, threads=1, job="pyjob")]
    tabs = [tables(w, "sgd") for w in workers]
    plan = [(0, 0), (0, 1), (1, 0)]  # (trainer, thread): trainer 0 pushes from two threads

    def pusher(tr, th):
        sp, dn = tabs[tr]
        for b in range(20):
            idx, g = batch(tr * 100 + th * 10, b)
            sp.push(KEYS[idx], g)
            dn.push(dense_grad(tr * 100 + th * 10, b))
            if mode == "half_async":
                workers[tr].step()

    run_threads([lambda tr=tr, th=th: pusher(tr, th) for tr, th in plan])
    for w in workers:
        w.close()  # flushes
    want, dwant = w0.copy(), d0.copy()
    for tr, th in plan:
        for b in range(20):
            idx, g = batch(tr * 100 + th * 10, b)
            np.subtract.at(want, idx, LR * g)
            dwant -= LR * dense_grad(tr * 100 + th * 10, b)
    got, dgot = initial(eps, "sgd")
    assert np.abs(got - want).max() <= 1e-4, "a gradient lost or applied twice"
    assert np.abs(dgot - dwant).max() <= 1e-4, "a dense gradient lost or applied twice"


# ---- GEO -------------------------------------------------------------------------------------

class GeoReference:
    """The GEO protocol played out on arrays (tests/test_ps_modes.c's geo_ref)."""

    def __init__(self, server, trainers):
        self.server, self.n = server.copy(), trainers
        self.local = np.zeros((trainers, POOL, DIM), np.float32)
        self.synced = np.zeros_like(self.local)
        self.known = np.zeros((trainers, POOL), bool)
        self.changed = np.zeros_like(self.known)
        self.touched = np.zeros_like(self.known)

    def pulled(self, t, idx):
        for i in idx:
            if not self.known[t, i]:
                self.known[t, i] = True
                self.local[t, i] = self.synced[t, i] = self.server[i]
        return self.local[t, idx]

    def pushed(self, t, idx, g):
        for j, i in enumerate(idx):
            self.touched[t, i] = True
            self.local[t, i] -= LR * g[j]

    def sync(self, t):
        inv = np.float32(1) / np.float32(self.n)
        for i in range(POOL):
            if not (self.known[t, i] and self.touched[t, i]):
                continue
            self.touched[t, i] = False
            delta = (self.local[t, i] - self.synced[t, i]) * inv
            if not delta.any():
                continue
            self.synced[t, i] += delta
            self.server[i] += delta
            for u in range(self.n):
                self.changed[u, i] |= u != t
        for i in range(POOL):
            if not self.changed[t, i]:
                continue
            self.changed[t, i] = False
            if self.known[t, i]:
                own = self.local[t, i] - self.synced[t, i]
                self.local[t, i] = np.where(own == 0, self.server[i], self.server[i] + own)
                self.synced[t, i] = self.server[i]


def test_geo_local_copies_and_servers_follow_the_protocol(ps_servers):
    eps = ps_servers(2)
    w0, _ = initial(eps, "sgd", geo=2)
    ref = GeoReference(w0, 2)
    workers = [ps.Worker(eps, mode="geo", trainer_id=t, trainers=2, geo_every=2, job="pyjob")
               for t in range(2)]
    tabs = [tables(w, "sgd", geo=2)[0] for w in workers]
    for s in range(8):
        for t in range(2):
            idx, g = batch(t, s)
            near(tabs[t].pull(KEYS[idx]), ref.pulled(t, idx), f"step {s} trainer {t} local")
            tabs[t].push(KEYS[idx], g)
            ref.pushed(t, idx, g)
            workers[t].step()
            if (s + 1) % 2 == 0:
                ref.sync(t)
    got, _ = initial(eps, "sgd", geo=2)
    near(got, ref.server, "the servers' rows")
    for w in workers:
        w.close()


# ---- SparseEmbedding ---------------------------------------------------------------------------

@pytest.mark.parametrize("pool", ["sum", "mean", "offsets"])
def test_sparse_embedding_matches_embedding_bag_forward_and_update(ps_servers, pool):
    """Forward: the pooled rows of each example, as nn.EmbeddingBag pools the same rows;
    backward: every row moves by lr times its gradient summed over the batch (SGD), as torch's
    SGD moves the EmbeddingBag's."""
    torch = pytest.importorskip("torch")
    from edl.torch import SparseEmbedding
    eps = ps_servers(1)
    with ps.Worker(eps, mode="async", job="pyjob") as w:
        emb = SparseEmbedding(3, DIM, mode="mean" if pool == "mean" else "sum", worker=w,
                              optimizer="sgd", lr=float(LR), seed=5)
        ids = torch.tensor([[3, 9, 3], [7, 9, 1]], dtype=torch.int64)  # a repeated id
        weights = emb.table.pull(torch.arange(10)).clone()  # rows 0..9 as the servers hold them
        ref = torch.nn.EmbeddingBag(10, DIM, mode=emb.mode, _weight=weights.clone())
        opt = torch.optim.SGD(ref.parameters(), lr=float(LR))
        coef = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
        if pool == "offsets":
            flat, offsets = torch.tensor([3, 9, 3, 7, 9, 1]), torch.tensor([0, 2])
            got, want = emb(flat, offsets), ref(flat, offsets)
        else:
            got, want = emb(ids), ref(ids)
        assert torch.allclose(got, want, atol=1e-6)
        (got * coef).sum().backward()
        (want * coef).sum().backward()
        opt.step()
        w.flush()
        after = emb.table.pull(torch.arange(10), direct=True)
        assert torch.allclose(after, ref.weight.detach(), atol=1e-6)
        assert torch.equal(after[[0, 2, 4, 5, 6, 8]], weights[[0, 2, 4, 5, 6, 8]])  # untouched
