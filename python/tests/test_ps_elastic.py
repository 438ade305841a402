"""A parameter server SIGKILLed while a PyTorch trainer trains, under a real `edl run --ps` (its
own etcd, a job server, an agent per pod; the servers are edl.fleet.run_server in Python
processes): the tables have 2 replicas, so no acknowledged update is lost. Every update of
scripts/ps_counting.py is a count (SGD at lr 1 from zero, gradients of 1): after its last flush
every row is minus the times its id appeared, and every dense element minus the steps."""
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import BIN_DIR, stop, wait_for

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ps_counting.py")
STARTED = re.compile(r"^pycount-0\s+\| .*trainer \d+ started as rank")


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def test_a_server_killed_with_two_replicas_loses_no_acknowledged_update(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "run.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [os.path.join(BIN_DIR, "edl"), "run", "--job", "pycount", "--np", "1", "--ps", "1:2",
           "--settle-ms", "300", "--grace-ms", "5000", "--", sys.executable, SCRIPT, "--out",
           str(out), "--steps", "400", "--step-ms", "10", "--replicas", "2"]
    with open(log, "w") as f:
        run = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        servers = [out / "server.pycount-ps-0", out / "server.pycount-ps-1"]
        step = out / "step.pycount-0"
        wait_for(lambda: all(p.exists() for p in servers) and read_int(step) >= 80, 120,
                 f"both servers and 80 steps:\n{log.read_text()[-3000:]}")
        os.kill(read_int(servers[0]), signal.SIGKILL)
        at = read_int(step)
        assert at < 400, "the trainer had finished before the server died"
        assert run.wait(240) == 0, log.read_text()[-5000:]
    finally:
        stop(run)
    text = log.read_text()
    assert re.search(r"400 steps, 38400 updates of 1000 rows: 0 rows and 0 dense elements not "
                     r"as counted", text), text[-5000:]
    assert len([l for l in text.splitlines() if STARTED.match(l)]) == 1  # never restarted
    print(f"a server SIGKILLed at step {at} of 400: every update applied once")
