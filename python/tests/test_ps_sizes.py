"""edl.ps passes no size to C unchecked (issue 39): a dim, shards or replicas past 32 bits
was cut to its low bits ("I" format: dim=2**32+8 made a dim-8 table on the servers while
Python kept the huge dim; shards=2**32+4 and replicas=2**32+1 became 4 and 1), and the
error for dim=2**40 said "dim 0". Each is refused before anything reaches a server, naming
the value; big-endian keys are refused saying so."""
import numpy as np
import pytest

import edl
import edl.ps as ps


@pytest.fixture
def worker(ps_servers):
    with ps.Worker(ps_servers(1), mode=None, job="pyjob") as w:
        yield w


@pytest.mark.parametrize("kw,name,value", [
    ({"dim": 2**32 + 8}, "dim", 2**32 + 8), ({"dim": 2**40}, "dim", 2**40),
    ({"shards": 2**32 + 4}, "shards", 2**32 + 4), ({"replicas": 2**32 + 1}, "replicas", 2**32 + 1),
    ({"dim": -1}, "dim", -1), ({"seed": -5}, "seed", -5), ({"seed": 2**64}, "seed", 2**64)])
def test_sizes_out_of_range_are_refused_naming_the_value(worker, kw, name, value):
    with pytest.raises(ValueError, match=rf"\b{name}={value} is out of range"):
        ps.SparseTable(1, worker=worker, **kw)
    assert worker.stats()["tables"] == 0  # nothing reached the server


def test_dense_sizes_and_offsets_out_of_range_are_refused(worker):
    with pytest.raises(ValueError, match=r"size=-3 is out of range"):
        ps.DenseTable(2, size=-3, worker=worker)
    t = ps.DenseTable(2, size=8, worker=worker)
    with pytest.raises(ValueError, match=r"offset=-1 is out of range"):
        t.pull(np.empty(2, dtype=np.float32), offset=-1)
    with pytest.raises(ValueError, match=rf"table={2**32 + 2} is out of range"):
        worker._w.pull_dense(2**32 + 2, 0, 0, 0)


def test_sizes_in_range_still_make_their_table(worker):
    t = ps.SparseTable(1, dim=4, shards=16, replicas=1, seed=2**64 - 1, worker=worker)
    rows = t.pull(np.arange(3, dtype=np.int64))
    assert rows.shape == (3, 4) and worker.stats()["tables"] == 1


def test_big_endian_keys_are_refused_saying_so(worker):
    t = ps.SparseTable(1, dim=4, worker=worker)
    with pytest.raises(TypeError, match=r"big-endian int64.*astype\(np.int64\)"):
        t.pull(np.arange(3, dtype=">i8"))
    with pytest.raises(TypeError, match=r"big-endian float32"):
        t.push(np.arange(3, dtype=np.int64), np.zeros((3, 4), dtype=">f4"))
