"""edl.torch for scripts written the usual PyTorch way: DistributedDataParallel rebuilt on each
generation's group, a DataLoader with worker processes that still uses each sample once,
reset callbacks, gradients averaged like DDP, torch's failures told from the script's own by
their types, a peer dying in the synchronisation after a re-formation, and the conversion of
examples/python/train_ddp.py into train_ddp_elastic.py within ten changed lines. (Under churn,
with real jobs: test_torch_elastic.py's DDP variant.)"""
import difflib
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

import torch.distributed as dist
import edl.torch as et
from conftest import SOURCE_DIR, free_port

EXAMPLES = os.path.join(SOURCE_DIR, "examples", "python")


def test_the_ddp_example_is_ten_changed_lines_from_the_conventional_one():
    with open(os.path.join(EXAMPLES, "train_ddp.py")) as f:
        before = f.read().splitlines()
    with open(os.path.join(EXAMPLES, "train_ddp_elastic.py")) as f:
        after = f.read().splitlines()
    ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
    # a changed line counts once: a hunk of a removed and b added lines changes max(a, b)
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
    added = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag != "equal")
    print(f"train_ddp.py -> train_ddp_elastic.py: {changed} changed lines ({added} added or "
          f"rewritten)")
    assert changed <= 10 and added <= 10, (changed, added)


def test_dataloader_workers_keep_the_consumed_position_and_each_sample_once():
    """Workers prefetch 2 x 2 batches ahead; the position is what the loop took; a failure
    after an uncommitted batch goes back to the commit and the next pass takes the rest."""
    et.world().ensure()  # outside edl: a world of one
    dataset = torch.utils.data.TensorDataset(torch.arange(1000))
    sampler = et.ElasticSampler(dataset, batch_size=64, seed=5)
    state = et.State(sampler=sampler, epoch=0)
    loader = et.DataLoader(dataset, batch_sampler=sampler, num_workers=2, prefetch_factor=2)
    state.sync()
    seen = []
    sampler.set_epoch(0)
    for i, (xb,) in enumerate(loader):
        if i == 3:  # taken, not committed: lost with the failure
            break
        seen += xb.tolist()
        state.commit()
    assert sampler.position == 4 * 64, f"position {sampler.position} after 4 batches taken"
    state.restore()
    assert sampler.position == 3 * 64, f"position {sampler.position} at the commit of 3"
    sampler.set_epoch(0)
    for (xb,) in loader:
        seen += xb.tolist()
        state.commit()
    assert sorted(seen) == list(range(1000))
    order = torch.randperm(1000, generator=torch.Generator().manual_seed(5)).tolist()
    assert seen == order


def test_ddp_is_built_again_on_a_new_generation_from_the_same_module():
    w = et.world()
    w.ensure()
    module = torch.nn.Linear(3, 1)
    model = et.DistributedDataParallel(module, find_unused_parameters=False)
    x = torch.randn(5, 3)
    model(x).sum().backward()
    first = model._ddp
    assert first.module is module and first.find_unused_parameters is False
    grad = module.weight.grad.clone()
    module.zero_grad()
    gen = (w.generation or 0) + 1  # a re-formation (a world of one again)
    w.form({"generation": gen, "rank": 0, "world_size": 1, "master_addr": "127.0.0.1",
            "master_port": 0})
    assert model._ddp is None, "the old DDP still holds the destroyed group"
    model(x).sum().backward()
    assert model._ddp is not first and model._ddp.module is module
    assert torch.equal(module.weight.grad, grad), "gradients reduced twice (old hooks alive)"
    with model.no_sync():
        model(x).sum().backward()
    assert torch.equal(module.weight.grad, 2 * grad)
    assert list(model.state_dict()) == ["module.weight", "module.bias"]


def test_torch_failures_are_told_by_type_and_the_scripts_own_are_not():
    class DistBackendError(RuntimeError):  # torch 2.x's type, its words unknown
        pass

    real = [getattr(dist, n) for n in ("DistError", "DistBackendError", "DistNetworkError",
                                       "DistStoreError") if isinstance(getattr(dist, n, None),
                                                                       type)]
    for t in real:  # torch 2.x: the types themselves
        assert et._is_comm_error(t("rank 1 went away")), t
    saved = et._COMM_TYPES
    try:
        et._COMM_TYPES = (DistBackendError,)
        assert et._is_comm_error(DistBackendError("NCCL communicator was aborted on rank 0"))
        assert et._is_comm_error(DistBackendError("anything"))
    finally:
        et._COMM_TYPES = saved
    # torch 1.13: a bare RuntimeError from gloo, recognised by its words as the last resort
    assert et._is_comm_error(RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed "
                                          "by peer [127.0.0.1]:4242"))
    assert not et._is_comm_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not et._is_comm_error(ValueError("connection reset in my parser"))
    assert not et._is_comm_error(NotImplementedError("socket peer"))
    assert not et._is_comm_error(KeyError("gloo"))


def test_a_peer_dying_in_the_sync_after_a_reformation_is_recovered_and_resets_run(monkeypatch):
    """The first pass fails in a collective; the sync after the re-formation fails too (a
    second peer died in its broadcast): the trainer recovers again, calls the reset callbacks
    once the state is synchronised, and finishes."""
    et.world().ensure()
    state = et.State(step=0)
    recovered, syncs, resets, passes = [], [0], [], []
    monkeypatch.setattr(et, "_recover", lambda w, failure: recovered.append(failure))
    real_sync = et.State.sync

    def sync(self):
        syncs[0] += 1
        if syncs[0] == 2:
            raise RuntimeError("Connection reset by peer")
        real_sync(self)

    monkeypatch.setattr(et.State, "sync", sync)
    state.register_reset_callbacks([lambda: resets.append(syncs[0])])

    @et.elastic
    def train(state):
        passes.append(state.step)
        state.step += 1
        if len(passes) == 1:  # before its commit: the step is lost
            raise RuntimeError("[gloo] Connection closed by peer")
        state.commit()
        return "done"

    assert train(state) == "done"
    assert len(recovered) == 2 and "Connection reset" in recovered[1], recovered
    assert resets == [3], resets  # after the third (successful) sync only
    assert passes == [0, 0] and state.step == 1, passes  # the lost step done again


def test_elastic_on_a_state_runs_a_function_without_arguments():
    et.world().ensure()
    state = et.State(epoch=0)

    @et.elastic(state)
    def train(n):
        state.epoch = n
        state.commit()
        return n * 2

    assert train(21) == 42 and state.epoch == 21 and train.__name__ == "train"


TWO_RANKS = r"""
import datetime, sys, torch, torch.distributed as dist, edl.torch as et
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
w = et.world()
w.generation, w.rank, w.world_size = 1, rank, 2
torch.manual_seed(0)
x, y = torch.randn(8, 3), torch.randn(8, 1)
model = torch.nn.Linear(3, 1)
mine = slice(4 * rank, 4 * rank + 4)
torch.nn.MSELoss()(model(x[mine]), y[mine]).backward()
et.allreduce_gradients(model)
print("allreduce", model.weight.grad.view(-1).tolist(), flush=True)
model.zero_grad()
ddp = et.DistributedDataParallel(model)
torch.nn.MSELoss()(ddp(x[mine]), y[mine]).backward()
print("ddp", model.weight.grad.view(-1).tolist(), flush=True)
"""


@pytest.mark.whole_job
def test_a_mean_loss_gives_the_global_batchs_gradient_on_two_ranks():
    """nn.MSELoss() on each rank's half, allreduce_gradients(model) by default and DDP: the
    gradient of the mean over the whole batch, not twice it."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", TWO_RANKS, str(r), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    model = torch.nn.Linear(3, 1)
    torch.nn.MSELoss()(model(x), y).backward()
    want = model.weight.grad.view(-1)
    for out, _ in outs:
        got = {line.split()[0]: torch.tensor(json.loads(line.split(" ", 1)[1]))
               for line in out.splitlines()}
        for how in ("allreduce", "ddp"):
            assert torch.allclose(got[how], want, atol=1e-6), (how, got[how], want)
