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
# seconds of steps, unslowed: 1,536 steps, about 4 s here (12 epochs took 1.1 s, so a kill 1 s
# after the log showed the formation could come after the last step, on a loaded machine)
LONG = ["--epochs", "48", "--samples", "2048", "--batch", "64"]
STEPS_TRAINER = os.path.join(os.path.dirname(__file__), "scripts", "steps_trainer.py")
STEP = re.compile(r"edl-steps pod (\S+) step (\d+) rank \d+ world \d+ t ([\d.]+)")
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

    def __init__(self, tmp_path, name, replicas, step_ms, args=ARGS, settle_ms=300,
                 script=os.path.join(EXAMPLES, "train_elastic.py")):
        self.name, self.log = name, tmp_path / f"{name}.log"
        self.out = tmp_path / f"{name}.pt"
        cmd = [os.path.join(BIN_DIR, "edl"), "run", "--job", name, "--np", "1:3", "--replicas",
               str(replicas), "--elastic-mode", "inprocess", "--settle-ms", str(settle_ms),
               "--ttl", "3",
               "--", sys.executable, script, *args,
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

    def steps(self):
        """{pod: [(step, wall time)]} of steps_trainer.py's lines, in order."""
        out = {}
        for m in STEP.finditer(self.text()):
            out.setdefault(m[1], []).append((int(m[2]), float(m[3])))
        return out

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


DDP_ELASTIC = os.path.join(EXAMPLES, "train_ddp_elastic.py")
# a global batch every world of 1-3 splits evenly: DDP's mean of the ranks' mean losses is
# then the global batch's mean, and the weights are one process's
DDP_ARGS = ["--epochs", "3", "--samples", "1800", "--batch", "60", "--workers", "2"]


@pytest.mark.whole_job
def test_churn_keeps_survivors_and_gives_the_same_model(tmp_path):
    want = local_weights(tmp_path)
    job = Job(tmp_path, "pychurn", 2, 100)  # slow enough that pod 0 alone cannot finish
    # the job before the replacement of the killed pod joins (python and torch start first)
    churn(job, want)


@pytest.mark.whole_job
def test_ddp_with_dataloader_workers_under_churn_gives_the_same_model(tmp_path):
    """train_ddp_elastic.py (edl.torch.DistributedDataParallel rebuilt in every generation, a
    DataLoader with 2 workers over ElasticSampler, StepLR in the State) through the same
    churn gives the weights of the same script run alone."""
    alone = tmp_path / "alone.pt"
    subprocess.run([sys.executable, DDP_ELASTIC, *DDP_ARGS, "--out", str(alone)], check=True,
                   env=env(), timeout=120)
    job = Job(tmp_path, "pyddp", 2, 100, DDP_ARGS, script=DDP_ELASTIC)
    churn(job, torch.load(alone))


def churn(job, want):
    """Scale job 2 -> 3 -> 2, SIGKILL a pod's agent; the survivor keeps its process and the
    weights are want's."""
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
    # the survivor goes on alone at once (the replacement joins once it is ready, if the job
    # has not ended by then: test_a_trainer_killed_in_a_live_pod_costs_only_the_reformation)
    assert any(f[0] == f"{job.name}-0" and f[3] == 1 for f in formed), formed
    assert_close(want, torch.load(job.out))


def redone(steps):
    """Steps a pod ran more than once (went back to a commit), as {pod: [step]}."""
    out = {}
    for pod, seq in steps.items():
        seen, again = set(), []
        for step, _ in seq:
            if step in seen:
                again.append(step)
            seen.add(step)
        if again:
            out[pod] = again
    return out


def survivors_gap(steps, pods, since):
    """The longest time between two consecutive steps of any of pods, from the last step
    before `since` (wall clock) on."""
    gap = 0.0
    for pod in pods:
        times = [t for _, t in steps[pod]]
        first = max([i for i, t in enumerate(times) if t <= since], default=None)
        assert first is not None and first + 1 < len(times), (pod, since, times[-3:])
        gap = max(gap, max(b - a for a, b in zip(times[first:], times[first + 1:])))
    return gap


@pytest.mark.whole_job
def test_a_graceful_leave_stops_at_a_commit_with_nothing_redone(tmp_path):
    """`edl scale J 2` of 3: the leaving trainer is told, stops at the next commit together with
    the others and exits 0; no survivor's collective fails and no step is run twice."""
    args = ["--epochs", "4", "--commit-every", "5"]
    job = Job(tmp_path, "pyleave", 3, 40, args, script=STEPS_TRAINER)
    try:
        job.wait_world(3)
        wait_for(lambda: len(job.steps().get(f"{job.name}-2", [])) >= 12, 60, "steps in 3")
        job.edl("scale", job.name, "2")
        job.wait_world(2)
        assert job.finish() == 0, job.text()[-4000:]
    finally:
        stop(job.proc)
    text = job.text()
    assert "a collective failed" not in text, text[-4000:]
    assert "this pod leaves the job" in text, text[-4000:]
    assert "did not reach a commit" not in text, text[-4000:]
    assert redone(job.steps()) == {}, f"steps run again after going back: {redone(job.steps())}"


@pytest.mark.whole_job
def test_a_trainer_killed_in_a_live_pod_costs_only_the_reformation(tmp_path):
    """SIGKILL one trainer of 3 (its pod and agent live on): the survivors continue in the
    smaller world at once, and the replacement joins once it has imported torch."""
    args = ["--epochs", "6", "--commit-every", "5"]
    want = local_weights(tmp_path, ["--epochs", "6", "--samples", "2048", "--batch", "64"])
    job = Job(tmp_path, "pycrash", 3, 20, args, script=STEPS_TRAINER)
    try:
        job.wait_world(3)
        victim_pod = f"{job.name}-1"
        wait_for(lambda: len(job.steps().get(victim_pod, [])) >= 10, 60, "steps in 3")
        victim = trainer_pid(job, victim_pod)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: any(f[0] == victim_pod and f[4] != victim for f in job.formed()), 60,
                 "the replacement trainer joined")
        assert job.finish() == 0, job.text()[-4000:]
    finally:
        stop(job.proc)
    gap = survivors_gap(job.steps(), (f"{job.name}-0", f"{job.name}-2"), killed_at)
    print(f"survivors' longest step gap from the SIGKILL to the end (the replacement's join "
          f"included): {gap:.3f} s")
    assert gap < 2.0, f"survivors stalled {gap:.3f} s:\n{job.text()[-4000:]}"
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
