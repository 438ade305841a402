"""edl.torch for real: examples/python/train_elastic.py under `edl run` (its own etcd, a job
server, one edl-agent per pod) in InProcess mode, scaled 2 -> 3 -> 2 and losing a pod to
SIGKILL, against examples/python/train_local.py run alone. The survivors keep their
processes, no restart is spent, every sample is used once per epoch, and the final weights
are the single process's within 1e-5 (relative). Then a trainer killed inside an allreduce.
The sampler's exactly-once rule and the State's bookkeeping are checked without processes."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

import edl.torch as et
from conftest import BIN_DIR, SOURCE_DIR, stop, wait_for

EXAMPLES = os.path.join(SOURCE_DIR, "examples", "python")
ARGS = ["--epochs", "3", "--samples", "2048", "--batch", "64"]
LONG = ["--epochs", "12", "--samples", "2048", "--batch", "64"]  # seconds of steps, unslowed
FORMED = re.compile(r"^\[(?:rank \d+ )?(\S+)\] edl\.torch: generation (\d+): rank (\d+) of (\d+) \(pid (\d+)\)")


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e


def local_weights(tmp_path, args=ARGS):
    out = tmp_path / "local.pt"
    subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_local.py"), *args, "--out",
                    str(out)], check=True, env=env(), timeout=120)
    return torch.load(out)


def assert_close(a, b):
    """The weights as one vector: max |a - b| within 1e-5 of max |a| (float sums in another
    order over other world sizes differ in their last bits, and momentum carries that on)."""
    va = torch.cat([a[k].reshape(-1) for k in a])
    vb = torch.cat([b[k].reshape(-1) for k in a])
    rel = ((va - vb).abs().max() / va.abs().max()).item()
    assert rel <= 1e-5, f"relative difference {rel}"


class Job:
    """`edl run` of train_elastic.py in InProcess mode; its output collected in a file."""

    def __init__(self, tmp_path, name, replicas, step_ms, args=ARGS, settle_ms=300):
        self.name, self.log = name, tmp_path / f"{name}.log"
        self.out = tmp_path / f"{name}.pt"
        cmd = [os.path.join(BIN_DIR, "edl"), "run", "--job", name, "--np", "1:3", "--replicas",
               str(replicas), "--elastic-mode", "inprocess", "--settle-ms", str(settle_ms),
               "--ttl", "3",
               "--", sys.executable, os.path.join(EXAMPLES, "train_elastic.py"), *args,
               "--step-ms", str(step_ms), "--out", str(self.out)]
        self.f = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.f, stderr=subprocess.STDOUT, env=env(),
                                     start_new_session=True)

    def text(self):
        return self.log.read_text(errors="replace")

    def formed(self):
        """[(pod, generation, rank, world, pid)] of every formation, in order."""
        return [(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5]))
                for m in (FORMED.match(line) for line in self.text().splitlines()) if m]

    def wait_world(self, size, timeout=60):
        wait_for(lambda: any(f[3] == size for f in self.formed()[-size:]) and
                 len({f[1] for f in self.formed()[-size:]}) == 1, timeout,
                 f"a generation of {size} formed:\n{self.text()[-3000:]}")

    def edl(self, *args):
        subprocess.run([os.path.join(BIN_DIR, "edl"), *args], check=True, env=env(),
                       timeout=60, stdout=subprocess.DEVNULL)

    def finish(self, timeout=180):
        try:
            rc = self.proc.wait(timeout)
        finally:
            stop(self.proc)
            self.f.close()
        return rc


def agent_pid(pod):
    out = subprocess.run(["pgrep", "-f", f"edl-agent .*--pod {pod} "], capture_output=True,
                         text=True).stdout.split()
    return int(out[0]) if out else None


def trainer_pid(job, pod):
    pids = [f[4] for f in job.formed() if f[0] == pod]
    return pids[-1] if pids else None


@pytest.mark.whole_job
def test_churn_keeps_survivors_and_gives_the_same_model(tmp_path):
    want = local_weights(tmp_path)
    job = Job(tmp_path, "pychurn", 2, 100)  # slow enough that pod 0 alone cannot finish
    # the job before the replacement of the killed pod joins (python and torch start first)
    try:
        job.wait_world(2)
        job.edl("scale", job.name, "3")
        job.wait_world(3)
        job.edl("scale", job.name, "2")
        job.wait_world(2)
        pid = agent_pid(f"{job.name}-1")
        assert pid, job.text()[-2000:]
        os.kill(pid, signal.SIGKILL)  # the pod is lost; edl run starts a replacement
        assert job.finish() == 0, job.text()[-4000:]
    finally:
        stop(job.proc)
    text = job.text()
    formed = job.formed()
    survivor = [f[4] for f in formed if f[0] == f"{job.name}-0"]
    assert len(set(survivor)) == 1, f"pod 0's trainer was restarted: {formed}"
    assert len(survivor) >= 4, f"pod 0 re-formed only {len(survivor)} times: {formed}"
    assert {f[0] for f in formed} >= {f"{job.name}-0", f"{job.name}-1", f"{job.name}-2"}
    assert "restart" not in " ".join(l for l in text.splitlines() if "generation" in l
                                     and "running" in l)
    assert_close(want, torch.load(job.out))


@pytest.mark.whole_job
def test_a_trainer_killed_inside_an_allreduce(tmp_path):
    want = local_weights(tmp_path, LONG)
    job = Job(tmp_path, "pykill", 2, 0, LONG, settle_ms=3000)  # both pods in generation 1
    try:
        job.wait_world(2)
        time.sleep(1.0)  # training: nearly all of a step is its allreduce and compute
        victim = trainer_pid(job, f"{job.name}-1")
        os.kill(victim, signal.SIGKILL)
        assert job.finish() == 0, job.text()[-4000:]
    finally:
        stop(job.proc)
    formed = job.formed()
    assert len({f[4] for f in formed if f[0] == f"{job.name}-0"}) == 1, formed
    assert any(f[0] == f"{job.name}-1" and f[4] != victim for f in formed), formed
    assert_close(want, torch.load(job.out))


class _FakeWorld:
    def __init__(self, rank, size):
        self.rank, self.world_size = rank, size


def test_the_sampler_uses_each_sample_once_across_world_changes(monkeypatch):
    n, g = 1000, 64
    samplers = {}
    seen = []
    world = _FakeWorld(0, 1)
    monkeypatch.setattr(et, "world", lambda: world)
    committed = et.ElasticSampler(n, global_batch_size=g, seed=3).state_dict()
    sizes = [2, 3, 3, 1, 4, 2]
    step = 0
    while True:
        size = sizes[step % len(sizes)]
        parts, totals = [], []
        for r in range(size):  # every rank of this world takes its share of one global batch
            world.rank, world.world_size = r, size
            s = samplers.setdefault((step, r), et.ElasticSampler(n, global_batch_size=g, seed=3))
            s.load_state_dict(committed)
            it = s.batches(0)
            part = next(it, None)
            if part is None:
                break
            parts.append(part)
            totals.append(s.batch_total)
            nxt = s.state_dict()
        if not parts:
            break
        assert len(set(totals)) == 1 and sum(map(len, parts)) == totals[0] <= g
        if step % 5 != 4:  # every fifth step is lost before its commit: done again
            seen += [i for p in parts for i in p]
            committed = nxt
        step += 1
    assert sorted(seen) == list(range(n))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(3)).tolist()
    assert seen == order  # and in the order of one process


def test_state_counters_commit_restore_and_refusals():
    model = torch.nn.Linear(2, 1)
    state = et.State(model=model, epoch=0, batch=5)
    with pytest.raises(AttributeError, match="State has no counter 'steps'"):
        _ = state.steps
    et.world().ensure()  # outside edl: a world of one
    state.sync()
    state.epoch = 2
    with torch.no_grad():
        model.weight.fill_(1.0)
    state.commit()
    state.epoch = 9
    with torch.no_grad():
        model.weight.fill_(5.0)
    state.restore()
    assert state.epoch == 2 and state.batch == 5 and torch.all(model.weight == 1.0)
    with pytest.raises(ValueError, match="batch_size"):
        et.ElasticSampler(10)


def test_the_store_probe_ends_at_its_timeout_on_a_port_that_never_answers():
    """edl.torch probes rank 0's store with _edl.wait_listening before torch connects. A port
    whose accept queue is full drops the SYN: the probe gives up at its timeout, not after the
    kernel's minutes of SYN retries."""
    import socket
    from edl import _edl
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(0)
    port = lsn.getsockname()[1]
    held = []
    try:
        for _ in range(8):  # fill the queue: the first connection that is not answered ends it
            s = socket.socket()
            s.settimeout(0.3)
            held.append(s)
            try:
                s.connect(("127.0.0.1", port))
            except socket.timeout:
                break
        else:
            pytest.skip("this kernel answers every SYN of a full accept queue")
        t0 = time.monotonic()
        with pytest.raises(Exception, match="did not accept a connection within 300 ms"):
            _edl.wait_listening("127.0.0.1", port, 300)
        assert time.monotonic() - t0 < 5
    finally:
        for s in held:
            s.close()
        lsn.close()
