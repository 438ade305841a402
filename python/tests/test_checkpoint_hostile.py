"""edl.checkpoint against checkpoints an attacker crafted (issue 39): every one is refused as
malformed (EDL_EPROTO), fast, with nothing allocated or read for it, and load_latest falls
back to the checkpoint before it. The structures crafted here are also the seeds of the
structure reader's fuzz corpus (fuzz/corpus/structure, test_structure_fuzz.py)."""
import faulthandler
import glob
import json
import os
import pickle
import time

import pytest

torch = pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

import edl
import edl.checkpoint as ckpt

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "fuzz", "corpus", "structure")


def seed(name):
    with open(os.path.join(CORPUS, name), "rb") as f:
        return f.read()


def save_raw(url, step, structure, tensors=()):
    """A checkpoint of edl.checkpoint's format whose structure shard is the bytes given."""
    shards = [("structure", structure)] + [(f"t{i}", t) for i, t in enumerate(tensors)]
    meta = json.dumps({"format": "edl.torch/1", "tensors": len(tensors)})
    ckpt._handle(url).save(step, ckpt._generation(None), shards, meta)


def newest_dir(scratch):
    """The checkpoint of the highest step: by name (ckpt-<16-digit step>-g<gen>), not mtime,
    whose granularity (a few ms) can make two quick saves look equally new."""
    return max(glob.glob(os.path.join(scratch, "ckpt-*")), key=os.path.basename)


@pytest.fixture
def url(in_job, scratch):
    u = "file://" + scratch
    ckpt.save({"w": torch.arange(4.0), "step": 1}, 1, u)
    return u


def assert_falls_back(url, within_s=5.0):
    """The newest checkpoint is passed over for step 1's, at once."""
    faulthandler.dump_traceback_later(60, exit=True)  # a load that blocks ends the run
    try:
        t0 = time.monotonic()
        obj, step = ckpt.load_latest(url)
        took = time.monotonic() - t0
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert step == 1 and torch.equal(obj["w"], torch.arange(4.0))
    assert took < within_s, f"the fall-back took {took:.1f} s"


def refusal(url, step):
    """The EDL_EPROTO that loading the checkpoint of `step` alone raises."""
    m = ckpt._handle(url).load_latest()
    assert m.step == step
    with pytest.raises(edl.Error) as e:
        ckpt._load(m, "cpu", False)
    assert e.value.name == "EDL_EPROTO"
    return str(e.value)


def test_a_tensor_referenced_twice_is_refused_before_any_read(url):
    # before: both references allocated a tensor, the first was freed and read into anyway
    big = bytes(1 << 20)
    save_raw(url, 2, seed("duplicate-index"), [big])
    assert "tensor 0 is referenced twice" in refusal(url, 2)
    assert_falls_back(url)


def test_a_memo_bomb_is_refused_fast(url):
    # ~150 bytes that expand to 2**24 list nodes: before, the walk took minutes
    save_raw(url, 2, seed("memo-bomb-24"))
    t0 = time.monotonic()
    assert "a bomb" in refusal(url, 2)
    assert time.monotonic() - t0 < 1.0
    assert_falls_back(url)


def test_a_tuple_bomb_as_a_dict_key_is_refused_before_hashing(url):
    save_raw(url, 2, seed("tuple-bomb-key"))
    assert "a bomb" in refusal(url, 2)


def test_unbounded_constructors_are_refused(url):
    # set(range(10**12)) grew without bound before
    save_raw(url, 2, seed("set-of-range"))
    assert "set of a range" in refusal(url, 2)
    assert_falls_back(url)


@pytest.mark.parametrize("name", ["not-a-pickle", "empty", "truncated"])
def test_a_structure_that_is_not_a_pickle_falls_back(url, name):
    # before: UnicodeDecodeError or EOFError, and no fall-back
    save_raw(url, 2, seed(name))
    assert "is malformed" in refusal(url, 2)
    assert_falls_back(url)


@pytest.mark.parametrize("name,why", [
    ("bad-dtype", "is not a torch dtype"), ("negative-shape", "non-negative integers"),
    ("huge-shape", "has no shard of"), ("int64-shape", "spans more than 2**63"), ("ref-as-key", "a dict key or in a set"),
    ("cycle", "a cycle"), ("deep", "nests deeper")])
def test_malformed_tensor_references_are_refused(url, name, why):
    save_raw(url, 2, seed(name), [bytes(16)])
    assert why in refusal(url, 2)
    assert_falls_back(url)


def test_every_checkpoint_malformed_is_one_clear_error(in_job, scratch):
    u = "file://" + scratch
    save_raw(u, 1, seed("empty"))
    save_raw(u, 2, seed("not-a-pickle"))
    with pytest.raises(edl.Error) as e:
        ckpt.load_latest(u)
    assert e.value.name == "EDL_EPROTO" and "no intact checkpoint" in str(e.value)
    assert "step 2" in str(e.value) and "step 1" in str(e.value)


def test_saves_go_on_after_a_fall_back_from_a_malformed_one(url):
    save_raw(url, 5, seed("not-a-pickle"))
    assert ckpt.load_latest(url)[1] == 1
    ckpt.save({"w": torch.ones(2)}, 2, url)  # the malformed step 5 no longer blocks step 2
    obj, step = ckpt.load_latest(url)
    assert step == 2 and torch.equal(obj["w"], torch.ones(2))


def test_another_writers_checkpoint_is_refused_not_passed_over(url):
    # not malformed, someone else's: falling back would drop it from the job's pointer
    ckpt._handle(url).save(2, ckpt._generation(None), [("raw", b"abc")], '{"format": "mine"}')
    with pytest.raises(edl.Error) as e:
        ckpt.load_latest(url)
    assert e.value.name == "EDL_EPROTO" and "format 'mine'" in str(e.value)
    assert ckpt._handle(url).load_latest().step == 2  # still the job's newest


def replace_shard(scratch, make):
    """Put make(path) where the newest checkpoint's tensor shard was."""
    path = os.path.join(newest_dir(scratch), "rank-0", "shard-1")
    os.unlink(path)
    make(path)
    return path


def test_a_fifo_shard_does_not_block_the_load(url, scratch):
    ckpt.save({"w": torch.ones(3), "step": 2}, 2, url)
    replace_shard(scratch, os.mkfifo)
    assert_falls_back(url)


def test_a_fifo_manifest_does_not_block_the_load(url, scratch):
    ckpt.save({"w": torch.ones(3), "step": 2}, 2, url)
    path = os.path.join(newest_dir(scratch), "manifest.json")
    os.unlink(path)
    os.mkfifo(path)
    assert_falls_back(url)


def test_a_dev_zero_shard_claiming_64_gib_costs_no_time(url, scratch):
    ckpt.save({"w": torch.ones(3), "step": 2}, 2, url)
    d = newest_dir(scratch)
    with open(os.path.join(d, "manifest.json")) as f:
        doc = json.load(f)
    doc["shards"][1]["size"] = 64 << 30  # before: 9.5 s of reading /dev/zero
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(doc, f)
    replace_shard(scratch, lambda p: os.symlink("/dev/zero", p))
    assert_falls_back(url, within_s=2.0)


def test_a_directory_shard_falls_back(url, scratch):
    ckpt.save({"w": torch.ones(3), "step": 2}, 2, url)
    replace_shard(scratch, os.mkdir)  # before: EDL_EIO and no fall-back
    assert_falls_back(url)

