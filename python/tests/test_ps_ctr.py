"""examples/python/ctr.py learns as well on the servers in every mode as with nn.EmbeddingBag in
one process (as tests/test_ps_modes.c's test of examples/ctr): one ctr.py server (edl.fleet's
run_server) and two ctr.py workers per mode, as processes with Paddle's variables."""
import os
import re
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, free_port, stop
from edl import _edl

pytest.importorskip("torch")

CTR = os.path.join(SOURCE_DIR, "examples", "python", "ctr.py")
ARGS = ["--examples", "40000", "--test", "10000"]
AUC = re.compile(r"test AUC (\d\.\d+)")


def env(**more):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), EDL_JOB_ID="pyctr")
    e.update(more)
    return e


def auc_of(text):
    m = AUC.search(text)
    assert m, text[-3000:]
    return float(m.group(1))


def run_mode(mode, tmp_path):
    """ctr.py with one server and two workers in mode: worker 0's test AUC."""
    port = free_port()
    common = dict(PADDLE_PSERVERS_IP_PORT_LIST=f"127.0.0.1:{port}", PADDLE_TRAINERS_NUM="2",
                  EDL_PS_MODE=mode)
    slog = open(tmp_path / f"server-{mode}.log", "w")
    server = subprocess.Popen([sys.executable, CTR, *ARGS], stdout=slog, stderr=subprocess.STDOUT,
                              env=env(TRAINING_ROLE="PSERVER", PADDLE_PORT=str(port), **common))
    try:  # a fixed set of servers: the workers connect once, to a server that listens
        _edl.wait_listening("127.0.0.1", port, 60000)
        workers = [subprocess.Popen([sys.executable, CTR, *ARGS], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    env=env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID=str(i),
                                            **common)) for i in range(2)]
        outs = [w.communicate(timeout=300)[0] for w in workers]
        for w, out in zip(workers, outs):
            assert w.returncode == 0, out[-3000:]
        assert "the job trained 156 batches of its 156" in outs[0], outs[0][-3000:]
        return auc_of(outs[0])
    finally:
        stop(server)
        slog.close()


@pytest.mark.whole_job
def test_ctr_py_learns_as_well_on_servers_in_every_mode(tmp_path, ps_secret):
    local = subprocess.run([sys.executable, CTR, "--local", *ARGS], capture_output=True,
                           text=True, env=env(), timeout=300)
    assert local.returncode == 0, local.stdout + local.stderr
    want = auc_of(local.stdout)
    print(f"local: AUC {want:.4f}")
    # async and half_async trail by how far their senders fall behind, which a loaded 2-core
    # machine stretches: two workers of ctr.py in async trailed by 0.003-0.022 over four runs
    # there (examples/ctr in C by 0.000-0.017 in the same hour); GEO's local copies the most
    for mode, slack in (("sync", 0.01), ("async", 0.03), ("half_async", 0.03), ("geo", 0.03)):
        auc = run_mode(mode, tmp_path)
        print(f"{mode}: AUC {auc:.4f}")
        assert auc >= want - slack, f"{mode}: AUC {auc:.4f}, the local model's {want:.4f}"
