"""edl.torch.State's checkpoints (a real etcd holds the pointer, files the objects):
State(checkpoint=url) resumes from the shape docs/python.md shows for edl.checkpoint.save (the
docs' own lines, run as written), from what State itself saves (every=N and save()), and from a
foreign dict as far as it fits, or refuses it once with CheckpointMismatch naming what is
missing. Two ranks of a real gloo group check that rank 0's load, or its refusal, reaches the
other rank; under `edl run` (scripts/state_resume.py) a trainer restarted with no state resumes
from State's last checkpoint, and a foreign one fails the job once (--restart-policy ExitCode)."""
import os
import re
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

import edl
import edl.checkpoint as ckpt
import edl.torch as et
from conftest import BIN_DIR, SOURCE_DIR, free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "state_resume.py")


def docs_block(containing):
    """The ```python block of docs/python.md that contains the given text."""
    with open(os.path.join(SOURCE_DIR, "docs", "python.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"docs/python.md: {len(found)} python blocks contain {containing!r}"
    return found[0]


def trained(seed):
    """A model and an Adam optimizer with state (one step taken)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values()))


def same_optimizer(a, b):
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sa.keys() == sb.keys() and all(
        torch.equal(sa[k][n], sb[k][n]) for k in sa for n in sa[k] if torch.is_tensor(sa[k][n]))


def entered(state):
    """Run state under @elastic with one commit; what train saw when it was entered."""
    seen = {}

    @et.elastic
    def train(state):
        seen.update(commits=state.commits, counters=dict(state._counters))
        state.commit()

    train(state)
    return seen


@pytest.fixture
def url(in_job, scratch):
    return "file://" + scratch


def test_state_resumes_from_the_docs_checkpoint_format(url):
    model, opt = trained(1)
    step = 700
    save_line = next(line for line in docs_block("import edl.checkpoint as ckpt").splitlines()
                     if line.startswith("ckpt.save("))
    exec(save_line, {"ckpt": ckpt, "model": model, "opt": opt, "step": step, "url": url})

    fresh, fresh_opt = trained(2)
    assert not same_weights(model, fresh)
    sampler = et.ElasticSampler(100, global_batch_size=10)
    # the docs' State with checkpoints, as written
    names = {"et": et, "model": fresh, "opt": fresh_opt, "sampler": sampler, "url": url}
    exec(docs_block("checkpoint=url, every="), names)
    state = names["state"]
    seen = entered(state)
    assert seen["commits"] == step and seen["counters"] == {"epoch": 3}
    assert same_weights(model, fresh) and same_optimizer(opt, fresh_opt)
    assert sampler.state_dict() == {"epoch": 0, "position": 0}  # not in it: kept


def test_state_saves_and_resumes_its_own_checkpoints(url):
    model, opt = trained(1)
    sampler = et.ElasticSampler(100, global_batch_size=10)
    state = et.State(model=model, optimizer=opt, sampler=sampler, epoch=0, batch=0,
                     checkpoint=url, every=2)
    kept = {}

    @et.elastic
    def train(state):
        for idx in sampler.batches(state.epoch):
            opt.zero_grad()
            model(torch.randn(len(idx), 4)).sum().backward()
            opt.step()
            state.batch += 1
            state.commit()
            if state.commits == 4:
                kept.update(model=[t.clone() for t in model.state_dict().values()],
                            sampler=sampler.state_dict())
            if state.commits == 5:
                return

    train(state)
    obj, step = ckpt.load_latest(url)
    assert step == 4 and sorted(obj) == ["batch", "epoch", "model", "optimizer", "sampler"]
    assert obj["batch"] == 4 and obj["sampler"] == kept["sampler"] == {"epoch": 0,
                                                                         "position": 40}
    state.save()                       # the last commit, now
    assert ckpt.load_latest(url)[1] == 5
    assert state.save() is None        # already saved: nothing to do

    fresh, fresh_opt = trained(3)
    fresh_sampler = et.ElasticSampler(100, global_batch_size=10)
    again = et.State(model=fresh, optimizer=fresh_opt, sampler=fresh_sampler, epoch=0, batch=0,
                     checkpoint=url, every=2)
    seen = entered(again)
    assert seen["commits"] == 5 and seen["counters"] == {"epoch": 0, "batch": 5}
    assert same_weights(model, fresh) and same_optimizer(opt, fresh_opt)
    assert fresh_sampler.state_dict() == {"epoch": 0, "position": 50}
    assert ckpt.load_latest(url)[1] == 6  # the step series goes on from the checkpoint's


def test_a_foreign_checkpoint_is_refused_once_naming_what_is_missing(url):
    model, opt = trained(1)
    ckpt.save({"net": model.state_dict(), "opt": opt.state_dict(), "iteration": 5}, 5, url)
    fresh, fresh_opt = trained(2)
    state = et.State(model=fresh, optimizer=fresh_opt, epoch=0, checkpoint=url)
    calls = []

    @et.elastic
    def train(state):
        calls.append(state.commits)

    with pytest.raises(et.CheckpointMismatch) as e:
        train(state)
    assert isinstance(e.value, edl.Error) and e.value.name == "EDL_EPROTO"
    assert "has no 'model' and no 'optimizer'" in str(e.value)
    assert "its keys: 'net', 'opt', 'iteration'" in str(e.value)
    assert calls == []  # nothing trained from scratch


def test_a_foreign_checkpoint_is_loaded_as_far_as_it_fits(url, capfd):
    model, opt = trained(1)
    ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": 9,
               "lr": 0.5}, 9, url)
    fresh, fresh_opt = trained(2)
    state = et.State(model=fresh, optimizer=fresh_opt, sampler=et.ElasticSampler(10, batch_size=2),
                     iteration=0, epoch=1, checkpoint=url)
    seen = entered(state)
    assert seen["counters"] == {"iteration": 9, "epoch": 1} and seen["commits"] == 9
    assert same_weights(model, fresh) and same_optimizer(opt, fresh_opt)
    err = capfd.readouterr().err
    assert "resumed from checkpoint step 9" in err
    assert "kept as they were: sampler, epoch" in err and "ignored: lr" in err


@pytest.mark.parametrize("saved, words", [
    (lambda m, o: {"model": torch.nn.Linear(3, 3).state_dict(), "optimizer": o.state_dict()},
     "its 'model' does not fit this State's model"),
    (lambda m, o: [m.state_dict(), o.state_dict()], "holds a list, not the dict"),
])
def test_a_checkpoint_that_does_not_load_is_refused(url, saved, words):
    model, opt = trained(1)
    ckpt.save(saved(model, opt), 3, url)
    fresh, fresh_opt = trained(2)
    with pytest.raises(et.CheckpointMismatch, match=re.escape(words)):
        entered(et.State(model=fresh, optimizer=fresh_opt, checkpoint=url))


def test_state_checkpoint_options_and_refusals():
    with pytest.raises(ValueError, match="an int >= 0"):
        et.State(checkpoint="file:///tmp/x", every=-1)
    with pytest.raises(ValueError, match="nothing committed yet"):
        et.State(checkpoint="file:///tmp/x").save()
    # every=N with no url saves nothing (outside a job a save would raise EDL_ECONFIG)
    model = torch.nn.Linear(2, 1)
    state = et.State(model=model, checkpoint=None, every=1)
    entered(state)
    assert state.commits == 1
    with pytest.raises(ValueError, match="no url"):
        state.save()


RANK = r"""
import datetime, os, sys, torch, torch.distributed as dist, edl.torch as et
rank, port, url, seed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
w = et.world()
w.generation, w.rank, w.world_size = 1, rank, 2
torch.manual_seed(seed + rank)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sampler = et.ElasticSampler(100, global_batch_size=10)
state = et.State(model=model, optimizer=opt, sampler=sampler, step=0, checkpoint=url)
try:
    state.sync()
except et.CheckpointMismatch as e:
    print("refused:", e, flush=True)
    sys.exit(3)
print("weights", model.weight.view(-1).tolist(), "step", state.step, "commits", state.commits,
      "sampler", sampler.state_dict(), "momentum", len(opt.state_dict()["state"]), flush=True)
"""


def two_ranks(url, seed):
    """[(exit code, stdout, stderr)] of RANK's two processes: again on another port, up to
    three times, when the store's port was taken meanwhile (free_port() only proposes one)."""
    for _ in range(3):
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(port), url,
                                   str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True,
                                  env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
                 for r in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
        if "address already in use" not in outs[0][1].lower():
            break
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


@pytest.mark.whole_job
def test_two_ranks_resume_from_rank_0s_load_or_both_refuse(url):
    torch.manual_seed(11)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ckpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 12,
               "sampler": {"epoch": 1, "position": 30}}, 12, url)
    ranks = two_ranks(url, 5)
    for rc, out, err in ranks:
        assert rc == 0, err[-2000:]
    want = (f"weights {model.weight.view(-1).tolist()} step 12 commits 12 sampler "
            f"{{'epoch': 1, 'position': 30}} momentum 2")
    assert [out.strip() for _, out, _ in ranks] == [want, want]

    ckpt.save({"weights": model.state_dict()}, 13, url)
    ranks = two_ranks(url, 5)
    assert [rc for rc, _, _ in ranks] == [3, 3], [err[-2000:] for _, _, err in ranks]
    outs = [out.strip() for _, out, _ in ranks]
    assert outs[0] == outs[1] and "has no 'model' and no 'optimizer'" in outs[0]


def edl_run(tmp_path, name, *args, policy=()):
    """`edl run` of scripts/state_resume.py, one pod, restart mode, checkpoints in tmp_path:
    (exit code, seconds, output)."""
    uri = tmp_path / f"{name}-ckpt"
    uri.mkdir()
    cmd = [os.path.join(BIN_DIR, "edl"), "run", "--job", name, "--np", "1", "--replicas", "1",
           "--elastic-mode", "restart", *policy, "--checkpoint-uri", f"file://{uri}", "--",
           sys.executable, SCRIPT, *args]
    t0 = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    return done.returncode, time.monotonic() - t0, done.stdout


@pytest.mark.whole_job
def test_a_trainer_started_again_resumes_from_states_checkpoint(tmp_path):
    rc, _, out = edl_run(tmp_path, "state-resume", "--every", "10", "--crash-at", "25")
    assert rc == 0, out[-3000:]
    entries = re.findall(r"\] (entered at .*)", out)
    # the crash after commit 25 lost 5 commits: the checkpoint of commit 20 (20 batches of 16)
    assert entries == ["entered at commit 0 epoch 0 position 0",
                       "entered at commit 20 epoch 0 position 320"], out[-3000:]
    assert "] done at commit 80" in out


@pytest.mark.whole_job
def test_a_foreign_checkpoint_fails_the_job_once(tmp_path):
    rc, seconds, out = edl_run(tmp_path, "state-foreign", "--foreign",
                               policy=("--restart-policy", "ExitCode"))
    assert rc != 0 and seconds < 60, out[-3000:]
    refusals = re.findall(r"^\[[^]]*\] edl\.torch\.CheckpointMismatch: (.*)", out, re.M)  # the trainer's own line
    assert len(refusals) == 1, out[-3000:]
    assert "has no 'model' and no 'optimizer' (its keys: 'net', 'iteration')" in refusals[0]
    assert "entered at" not in out  # nothing trained from scratch
