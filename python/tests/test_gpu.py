"""On a machine with a CUDA device (skipped elsewhere, saying why): CUDA tensors checkpointed
through the device path and loaded back where they were saved, and the nccl group formed,
aborted and formed again in place with edl.torch.DistributedDataParallel built again on it
(one GPU: a world of one)."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here (torch.cuda.is_available() is "
                                       "False): run on a GPU host")

import edl.checkpoint as ckpt  # noqa: E402
import edl.torch as et  # noqa: E402


def test_cuda_tensors_checkpoint_through_the_device_path(in_job, scratch):
    url = "file://" + scratch
    dev = torch.device("cuda", 0)
    obj = {"w": torch.randn(1 << 20, device=dev), "b": torch.arange(10, device=dev).half(),
           "cpu": torch.ones(3)}
    ckpt.save(obj, 1, url)
    back, step = ckpt.load_latest(url, map_location="as_saved")
    assert step == 1 and back["w"].is_cuda and not back["cpu"].is_cuda
    for k in obj:
        assert torch.equal(obj[k], back[k])
    p = ckpt.save_async(obj, 2, url, snapshot_in_background=True)
    assert p.snapshot_wait() and p.wait()


def test_nccl_group_reforms_in_place(monkeypatch):
    monkeypatch.setenv("EDL_TORCH_BACKEND", "nccl")
    w = et._World()
    a = {"generation": 1, "rank": 0, "world_size": 1, "master_addr": "127.0.0.1",
         "master_port": 0}
    w.form(a)
    t = torch.ones(4, device="cuda")
    torch.distributed.all_reduce(t)
    w.form(dict(a, generation=2))  # the old communicator aborted, a new one formed
    torch.distributed.all_reduce(t)
    assert w.generation == 2 and torch.equal(t, torch.ones(4, device="cuda"))
    w._destroy()


def test_ddp_on_nccl_is_built_again_after_a_reformation(monkeypatch):
    """edl.torch.DistributedDataParallel on the nccl group (device_ids: the generation's GPU),
    built again from the same module after the group is aborted and formed again."""
    monkeypatch.setenv("EDL_TORCH_BACKEND", "nccl")
    w = et._World()
    monkeypatch.setattr(et, "_the_world", w)
    a = {"generation": 1, "rank": 0, "world_size": 1, "master_addr": "127.0.0.1",
         "master_port": 0}
    w.form(a)
    module = torch.nn.Linear(8, 2).cuda()
    model = et.DistributedDataParallel(module)
    x = torch.randn(4, 8, device="cuda")
    model(x).sum().backward()
    first, grad = model._ddp, module.weight.grad.clone()
    module.zero_grad()
    w.form(dict(a, generation=2))
    assert model._ddp is None
    model(x).sum().backward()
    assert model._ddp is not first and model._ddp.device_ids == [w.device.index]
    assert torch.allclose(module.weight.grad, grad)
    w._destroy()
