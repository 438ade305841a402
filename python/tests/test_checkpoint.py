"""edl.checkpoint with torch tensors on file:// and s3:// (a real etcd holds the pointer, a
real s3rver the objects): save/load, async saves, fallback past a corrupt newest checkpoint,
and clear refusals."""
import glob
import os
import time
import weakref

import pytest

torch = pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

import edl
import edl.checkpoint as ckpt


def state_dict(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "name": "run", "scalars": [1.5, (2, "x")], "half": torch.arange(6).half(),
            "empty": torch.empty(0, 3), "view": torch.arange(12.0).view(3, 4).t()}


def assert_same(a, b):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict))
    if torch.is_tensor(a):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


@pytest.fixture(params=["file", "s3"])
def url(request, in_job, scratch):
    if request.param == "file":
        return "file://" + scratch
    return request.getfixturevalue("s3")


def test_save_and_load_round_trip(url):
    assert ckpt.load_latest(url) is None
    saved = state_dict(1)
    ckpt.save(saved, 10, url)
    loaded, step = ckpt.load_latest(url)
    assert step == 10
    assert_same(saved, loaded)
    assert_same(saved, ckpt.load(url))
    # a later step replaces it; an earlier one is refused (the pointer never goes back)
    ckpt.save(state_dict(2), 20, url)
    assert ckpt.load_latest(url)[1] == 20
    with pytest.raises(edl.Error) as e:
        ckpt.save(saved, 15, url)
    assert e.value.name == "EDL_ECONFLICT"


def test_async_saves_and_wait(url):
    saves = [ckpt.save_async(state_dict(s), s, url) for s in (1, 2, 3)]
    ckpt.wait()
    assert all(p.done for p in saves)
    loaded, step = ckpt.load_latest(url)
    assert step == 3
    assert_same(state_dict(3), loaded)
    # in the background: the tensors may be written once the snapshot is taken
    big = {"w": torch.randn(1 << 20)}
    copy = big["w"].clone()
    p = ckpt.save_async(big, 4, url, snapshot_in_background=True)
    assert p.snapshot_wait()
    big["w"].zero_()
    assert p.wait()
    assert torch.equal(ckpt.load(url)["w"], copy)


def test_saves_and_loads_tell_the_agent_their_time_and_bytes(in_job, scratch, monkeypatch):
    """Each save (a save_async once committed) and each load writes a progress line to the
    agent, "checkpoint save|load <ms> <bytes>": what its /metrics counts."""
    progress_r, progress_w = os.pipe()
    monkeypatch.setenv("EDL_PROGRESS_FD", str(progress_w))
    monkeypatch.delenv("EDL_CONTROL_FD", raising=False)
    monkeypatch.setattr(edl, "_the_link", None)  # a link of this test's, on the pipe
    url = "file://" + scratch
    saved = {"w": torch.zeros(1000), "step": 3}  # 4,000 bytes of tensor and the structure
    ckpt.save(saved, 1, url)
    assert ckpt.save_async(saved, 2, url).wait()
    assert ckpt.load_latest(url)[1] == 2
    edl._the_link.close()  # and the pipe's write end with it
    with os.fdopen(progress_r, "rb") as f:
        lines = [line.split() for line in f.read().decode().splitlines()]
    assert [line[:2] for line in lines] == [["checkpoint", "save"], ["checkpoint", "save"],
                                           ["checkpoint", "load"]], lines
    sizes = {int(line[3]) for line in lines}
    assert len(sizes) == 1 and 4000 < sizes.pop() < 5000, lines  # the same checkpoint's bytes
    assert all(0 <= int(line[2]) < 60000 for line in lines), lines


def test_a_background_snapshot_keeps_what_it_reads_alive(url):
    # The pickled structure is a bytes object that only the save holds once save_async returns;
    # the snapshot copies it later, in the background. Freed memory reused at once by bytes of
    # the same size must not end up in the checkpoint (and under ASan: no use after free).
    big = {"w": torch.randn(1 << 22), "note": "x" * 40, "n": 7}
    copy = big["w"].clone()
    p = ckpt.save_async(big, 5, url, snapshot_in_background=True)
    junk = [bytes([i % 251]) * n for i in range(2000) for n in (64, 75, 96, 128, 160)]
    assert p.wait()
    del junk
    loaded = ckpt.load(url)
    assert torch.equal(loaded["w"], copy) and loaded["note"] == "x" * 40 and loaded["n"] == 7
    # a Pending dropped while its snapshot runs waits for it rather than free what it reads
    shards, meta, _ = ckpt._shards({"w": copy})
    q = ckpt._handle(url, True).save_async(6, 0, shards, meta)
    del shards
    del q
    deadline = time.monotonic() + 30  # the save goes on alone and commits
    while ckpt.load_latest(url)[1] != 6:
        assert time.monotonic() < deadline, "the save of a dropped Pending never committed"
        time.sleep(0.05)
    assert torch.equal(ckpt.load_latest(url)[0]["w"], copy)


class Held:
    """Stands for the tensors a save holds (a weakref says when they are let go)."""


def test_a_failed_save_is_raised_once_and_lets_its_memory_go(in_job, scratch):
    url = "file://" + scratch
    ckpt.save({"w": torch.ones(4)}, 20, url)
    p = ckpt.save_async({"w": torch.zeros(4)}, 15, url)  # older than the pointer: refused
    with pytest.raises(edl.Error) as e:
        ckpt.wait()
    assert e.value.name == "EDL_ECONFLICT"
    assert p.done
    ckpt.wait()  # the failure was reported: nothing is left to raise
    later = ckpt.save_async({"w": torch.full((4,), 3.0)}, 30, url)
    ckpt.wait()
    assert later.done and torch.equal(ckpt.load(url)["w"], torch.full((4,), 3.0))
    # the handle of a failed save kept by the caller no longer holds what the save read
    keep = Held()
    gone = weakref.ref(keep)
    shards, meta, _ = ckpt._shards({"w": torch.zeros(4)})
    q = ckpt._handle(url).save_async(25, 0, shards, meta, keep)
    del keep
    with pytest.raises(edl.Error):
        q.wait()
    assert gone() is None, "a failed save still holds its shards' memory"


def test_shards_from_a_generator_stay_alive_while_they_are_saved(in_job, scratch):
    # The only references to these bytes are the generator's items: the save reads them with
    # the GIL released (1 MiB each: freed, glibc returns them to the system at once).
    url = "file://" + scratch
    h = ckpt._handle(url)

    def shards(fill):
        return ((f"s{i}", bytes([fill + i]) * (1 << 20)) for i in range(4))

    h.save(1, 0, shards(10))
    p = h.save_async(2, 0, shards(20))
    assert p.wait()
    m = h.load_latest()
    assert m.step == 2
    assert m.run is None  # no EDL_RUN_ID here: the save names no run
    assert [m.read(i) for i in range(4)] == [bytes([20 + i]) * (1 << 20) for i in range(4)]
    assert h.load_older(2).read(3) == bytes([13]) * (1 << 20)


def test_a_checkpoint_names_the_run_that_saved_it(in_job, scratch, monkeypatch):
    # The agent sets EDL_RUN_ID (the run's first generation's time); a handle opened under it
    # writes it into every document of its saves, and the manifest says it.
    monkeypatch.setenv("EDL_RUN_ID", "1764300000123")
    h = edl._edl.Checkpoint("file://" + scratch)
    h.save(3, 1, [("w", b"x" * 64)])
    assert h.load_latest().run == "1764300000123"
    with open(glob.glob(os.path.join(scratch, "ckpt-*3-g1", "rank-0", "done.json"))[0]) as f:
        assert '"run":"1764300000123"' in f.read().replace(" ", "")


def test_a_corrupt_newest_checkpoint_is_passed_over(in_job, scratch):
    url = "file://" + scratch
    ckpt.save(state_dict(1), 1, url)
    ckpt.save(state_dict(2), 2, url)
    shard = max(glob.glob(os.path.join(scratch, "ckpt-*2-g*", "rank-0", "shard-1")))
    with open(shard, "r+b") as f:  # one flipped byte in a tensor
        f.seek(3)
        b = f.read(1)
        f.seek(3)
        f.write(bytes([b[0] ^ 0xFF]))
    loaded, step = ckpt.load_latest(url)
    assert step == 1
    assert_same(state_dict(1), loaded)


def read_bytes():
    with open("/proc/self/io") as f:  # every thread's read(2)s, sockets included
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_a_load_reads_each_byte_once(in_job, scratch):
    """The digest is checked in the pass that reads each shard into its tensor: the
    checkpoint is not read a second time to verify it first."""
    url = "file://" + scratch
    saved = {"w": torch.randn(1 << 20), "b": torch.randn(1 << 19), "step": 4}
    ckpt.save(saved, 4, url)
    stored = sum(os.path.getsize(p) for p in glob.glob(os.path.join(scratch, "ckpt-*", "**"),
                                                        recursive=True) if os.path.isfile(p))
    before = read_bytes()
    loaded = ckpt.load(url)
    read = read_bytes() - before
    assert_same(saved, loaded)
    tensors = ((1 << 20) + (1 << 19)) * 4
    assert tensors <= read < 1.25 * stored, f"a load of {stored} bytes read {read}"


def test_refusals_name_the_cause(in_job, scratch, monkeypatch):
    url = "file://" + scratch
    with pytest.raises(TypeError, match=r"obj\['f'\] is a function"):
        ckpt.save({"ok": torch.ones(2), "f": lambda: 1}, 1, url)
    assert ckpt.load_latest(url) is None  # nothing half-saved
    with pytest.raises(edl.Error) as e:
        ckpt.load(url)
    assert e.value.name == "EDL_ENOTFOUND"
    # code in a checkpoint's bytes is not run unless trusted
    ckpt.save({"obj": torch.nn.Identity()}, 2, url)
    with pytest.raises(edl.Error, match="trusted=True"):
        ckpt.load(url)
    assert isinstance(ckpt.load(url, trusted=True)["obj"], torch.nn.Identity)
    with pytest.raises(edl.Error) as e:
        ckpt.save({"w": torch.ones(1)}, 3, "ftp://nowhere")
    assert e.value.name in ("EDL_EINVAL", "EDL_ECONFIG") and "ftp://nowhere" in str(e.value)
    # outside edl: no etcd, no checkpoint
    monkeypatch.delenv("EDL_ETCD_ENDPOINTS")
    ckpt._handles.clear()
    with pytest.raises(edl.Error) as e:
        ckpt.save({"w": torch.ones(1)}, 3, "file:///tmp/elsewhere")
    assert e.value.name == "EDL_ECONFIG" and "run under edl" in str(e.value)


@pytest.mark.whole_job
def test_pip_installs_the_package_offline(tmp_path):
    """`pip install --no-build-isolation ./python` builds the module through CMake and the
    installed package imports on its own."""
    import subprocess
    import sys
    from conftest import SOURCE_DIR
    pytest.importorskip("pip")
    pytest.importorskip("wheel")
    src = tmp_path / "src"  # a copy of the sources: the build leaves python/build behind
    src.mkdir()
    subprocess.run(f"tar -C {SOURCE_DIR} --exclude='./build*' --exclude='./tests/.*' "
                   f"--exclude='./.git' -cf - . | tar -C {src} -xf -", shell=True, check=True)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                    "--no-index", "--quiet", "--target", str(target), str(src / "python")],
                   check=True, timeout=900)
    out = subprocess.run([sys.executable, "-c", "import edl, edl.checkpoint, edl.torch, edl.ps, "
                          "edl.fleet, edl.distill; "
                          "print(edl._edl.__file__, edl.context().world_size)"],
                         cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith(str(target)) and out.strip().endswith(" 1")
