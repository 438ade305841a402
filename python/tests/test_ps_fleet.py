"""edl.fleet's roles from Paddle's environment, its worker in this process, run_server() in a
Python process with torch's threads (a SIGTERM or SIGINT stops it cleanly, whichever thread
the kernel hands it to), and every kind of bad input to edl.ps, edl.fleet and SparseEmbedding
raising an exception that says what is wrong."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import edl
import edl.fleet as fleet
import edl.ps as ps
from conftest import free_port


@pytest.fixture
def fresh_fleet(monkeypatch):
    """edl.fleet as if this process had just started (its state is the process's)."""
    monkeypatch.setattr(fleet, "_fleet", None)
    monkeypatch.setattr(fleet, "_worker", None)
    for k in ("TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM",
              "PADDLE_TRAINER_ID", "PADDLE_PORT", "EDL_PS_MODE", "EDL_GENERATION",
              "EDL_ETCD_ENDPOINTS", "EDL_POD_ID"):
        monkeypatch.delenv(k, raising=False)
    yield monkeypatch
    if fleet._worker is not None:
        fleet.stop_worker()


def trainer_env(m, eps, index=0, num=1):
    m.setenv("TRAINING_ROLE", "TRAINER")
    m.setenv("PADDLE_PSERVERS_IP_PORT_LIST", ",".join(eps))
    m.setenv("PADDLE_TRAINERS_NUM", str(num))
    m.setenv("PADDLE_TRAINER_ID", str(index))
    m.setenv("EDL_JOB_ID", "pyjob")


def test_roles_and_the_strategys_mode_come_from_the_environment(fresh_fleet, ps_secret):
    trainer_env(fresh_fleet, ["10.0.0.1:7000", "10.0.0.2:7000"], index=2, num=3)
    s = fleet.DistributedStrategy()
    s.a_sync = True
    s.a_sync_configs = {"k_steps": 5}  # Paddle's spelling of GEO every 5 steps
    assert (s.mode, s.geo_every) == ("geo", 5)
    fleet.init(strategy=s)
    assert fleet.is_worker() and not fleet.is_server() and not fleet.is_first_worker()
    assert (fleet.worker_index(), fleet.worker_num(), fleet.server_num()) == (2, 3, 2)
    assert fleet.server_endpoints() == ["10.0.0.1:7000", "10.0.0.2:7000"]
    assert fleet.server_endpoints(to_string=True) == "10.0.0.1:7000,10.0.0.2:7000"
    assert fleet.mode() == "geo"
    s.a_sync = False
    fleet.init(strategy=s)
    assert fleet.mode() == "sync"
    with pytest.raises(edl.Error, match="this process is a worker") as e:
        fleet.run_server()
    assert e.value.name == "EDL_EINVAL"


def test_the_fleets_worker_trains_and_stops(fresh_fleet, ps_servers):
    eps = ps_servers(2)
    trainer_env(fresh_fleet, eps)
    fresh_fleet.setenv("EDL_PS_MODE", "half_async")
    fleet.init()
    assert fleet.mode() == "half_async"
    with pytest.raises(edl.Error, match="init_worker"):
        ps.SparseTable(0, 4)  # no worker yet
    fleet.init_worker()
    t = ps.SparseTable(0, 4, optimizer="sgd", lr=1.0, init="zero")
    keys = np.array([5, 6, 5], np.int64)
    t.push(keys, np.ones((3, 4), np.float32))
    fleet.step()  # half_async: the merge buffer goes
    fleet.barrier_worker()
    assert np.array_equal(t.pull(keys), [[-2] * 4, [-1] * 4, [-2] * 4])
    fleet.stop_worker()
    with pytest.raises(edl.Error, match="init_worker"):
        fleet.worker()
    with pytest.raises(edl.Error, match="closed") as e:
        t.pull(keys)
    assert e.value.name == "EDL_ECLOSED"


SERVER = textwrap.dedent("""
    import threading, time, torch
    torch.set_num_threads(2)
    torch.ones(300, 300) @ torch.ones(300, 300)   # torch's pool threads exist now
    for _ in range(4):  # and threads that block no signal: the kernel may pick any of them
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    import edl.fleet as fleet
    fleet.init()
    fleet.init_server()
    print("serving", flush=True)
    fleet.run_server()
    print("stopped", flush=True)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_server_serves_in_process_and_stops_on_a_signal(ps_secret, tmp_path, sig):
    pytest.importorskip("torch")
    port = free_port()
    env = dict(os.environ, TRAINING_ROLE="PSERVER", PADDLE_PORT=str(port),
               PADDLE_PSERVERS_IP_PORT_LIST=f"127.0.0.1:{port}", PADDLE_TRAINERS_NUM="1",
               EDL_JOB_ID="pyjob", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SERVER], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        edl._edl.wait_listening("127.0.0.1", port, 60000)
        with ps.Worker([f"127.0.0.1:{port}"], mode="async", job="pyjob") as w:
            t = ps.SparseTable(1, 2, worker=w, optimizer="sgd", lr=0.5, init="zero")
            t.push(np.array([9], np.uint64), np.array([[2, 4]], np.float32))
            w.flush()
            assert np.array_equal(t.pull(np.array([9], np.uint64), direct=True), [[-1, -2]])
        proc.send_signal(sig)
        assert proc.wait(20) == 0, log.read_text()
        assert "stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_input_raises_exceptions_that_say_what_is_wrong(ps_servers, tmp_path):
    torch = pytest.importorskip("torch")
    from edl.torch import SparseEmbedding
    eps = ps_servers(1)
    w = ps.Worker(eps, mode="async", job="pyjob")
    t = ps.SparseTable(0, 4, worker=w)
    keys = np.arange(4, dtype=np.int64)
    cases = [
        (TypeError, "float64; want int64 or uint64", lambda: t.pull(keys.astype(np.float64))),
        (TypeError, "a list; want a numpy array or a torch tensor", lambda: t.pull([1, 2])),
        (ValueError, "not contiguous", lambda: t.pull(np.arange(8, dtype=np.int64)[::2])),
        (ValueError, "not contiguous", lambda: t.pull(torch.arange(8)[::2])),
        (TypeError, "torch tensor of float64", lambda: t.pull(keys, torch.zeros(4, 4).double())),
        (ValueError, "64 bytes, want 32", lambda: t.push(keys[:2], np.zeros((4, 4), np.float32))),
        (ValueError, "read-only", lambda: t.pull(keys, _readonly((4, 4)))),
        (ValueError, "ids are 0..255|an int in 0..255", lambda: ps.SparseTable(300, 4, worker=w)),
        (ValueError, "sgd, adagrad or adam", lambda: ps.SparseTable(1, 4, worker=w,
                                                                    optimizer="rmsprop")),
        (ValueError, "dim", lambda: ps.SparseTable(1, 0, worker=w)),
        (ValueError, "mode 'fast'", lambda: ps.Worker(eps, mode="fast")),
        (ValueError, "mode 'fast'", lambda: fleet.DistributedStrategy("fast")),
        (ValueError, "sum, mean, max or None", lambda: SparseEmbedding(t, mode="median")),
        (TypeError, "want torch.int64", lambda: SparseEmbedding(t)(torch.zeros(2, 2))),
        (ValueError, "want \\(batch, ids\\)", lambda: SparseEmbedding(t)(
            torch.zeros(2, 2, 2, dtype=torch.int64))),
        (ValueError, "CTR accessor", lambda: SparseEmbedding(2, 4, worker=w, accessor="ctr")),
    ]
    for exc, words, call in cases:
        with pytest.raises(exc, match=words):
            call()
    with pytest.raises(edl.Error, match="another config") as e:
        ps.SparseTable(0, 8, worker=w)  # table 0 has rows of 4
    assert e.value.name == "EDL_ECONFLICT"
    other = tmp_path / "other.secret"
    other.write_bytes(os.urandom(32))
    other.chmod(0o600)
    with pytest.raises(edl.Error) as e:
        ps.Worker(eps, job="pyjob", secret_file=str(other))
    assert e.value.name == "EDL_EAUTH" and "secret" in str(e.value)
    with pytest.raises(edl.Error) as e:
        ps.Worker([f"127.0.0.1:{free_port()}"], job="pyjob", timeout_ms=2000)
    assert e.value.name == "EDL_EUNAVAIL"
    w.close()
    with pytest.raises(edl.Error, match="closed"):
        t.pull(keys)


def _readonly(shape):
    a = np.zeros(shape, np.float32)
    a.flags.writeable = False
    return a


def test_fleet_without_its_environment_names_the_variable(fresh_fleet):
    with pytest.raises(edl.Error, match="TRAINING_ROLE") as e:
        fleet.init()
    assert e.value.name == "EDL_ECONFIG"
    fresh_fleet.setenv("TRAINING_ROLE", "TRAINER")
    fresh_fleet.setenv("PADDLE_TRAINERS_NUM", "2")
    fresh_fleet.setenv("PADDLE_TRAINER_ID", "0")
    with pytest.raises(edl.Error, match="PADDLE_PSERVERS_IP_PORT_LIST"):
        fleet.init()
    with pytest.raises(edl.Error, match="init\\(\\) first"):
        fleet.is_worker()
    with pytest.raises(ValueError, match="parameter-server side"):
        fleet.init(is_collective=True)
