"""Parameter servers that join and die while a PyTorch trainer trains, under a real `edl run
--ps` (a real etcd, a job server, an agent per pod; the servers are edl.fleet.run_server in
Python processes): a third server joins (`edl scale --role ps`) and takes its shards from the
others, then one is SIGKILLed; the tables have 2 replicas, so no acknowledged update is lost.
Every update of scripts/ps_counting.py is a count (SGD at lr 1 from zero, gradients of 1):
after its last flush every row is minus the times its id appeared, and every dense element
minus the steps."""
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import BIN_DIR, stop, wait_for

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ps_counting.py")
STARTED = re.compile(r"^\[(?:\w+ \d+ )?pycount-0\] .*trainer \d+ started as rank")


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


@pytest.mark.whole_job
def test_servers_join_and_die_with_two_replicas_and_no_acknowledged_update_is_lost(tmp_path,
                                                                                    etcd):
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "run.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    edl_cmd = os.path.join(BIN_DIR, "edl")
    cmd = [edl_cmd, "run", "--job", "pycount", "--np", "1", "--ps", "2:3", "--ps-replicas", "2",
           "--etcd", etcd, "--settle-ms", "300", "--grace-ms", "5000", "--", sys.executable,
           SCRIPT, "--out", str(out), "--steps", "600", "--step-ms", "10", "--replicas", "2"]
    with open(log, "w") as f:
        run = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        servers = [out / f"server.pycount-ps-{i}" for i in range(3)]
        step = out / "step.pycount-0"
        wait_for(lambda: all(p.exists() for p in servers[:2]) and read_int(step) >= 60, 120,
                 f"two servers and 60 steps:\n{log.read_text()[-3000:]}")
        subprocess.run([edl_cmd, "scale", "pycount", "3", "--role", "ps", "--etcd", etcd],
                       check=True, timeout=60, stdout=subprocess.DEVNULL, env=env)
        joined = read_int(step)
        wait_for(lambda: "sent" in log.read_text() and servers[2].exists() and
                 read_int(step) >= joined + 60, 120,
                 f"the third server and 60 more steps:\n{log.read_text()[-3000:]}")
        os.kill(read_int(servers[0]), signal.SIGKILL)
        at = read_int(step)
        assert at < 600, "the trainer had finished before the server died"
        assert run.wait(240) == 0, log.read_text()[-5000:]
    finally:
        stop(run)
    text = log.read_text()
    assert re.search(r"600 steps, 57600 updates of 1000 rows: 0 rows and 0 dense elements not "
                     r"as counted", text), text[-5000:]
    assert re.search(r"sent \d+ shards to pycount-ps-2", text), "the newcomer got no shards"
    assert "were not handed over" not in text  # the killed one's shards lived on its backups
    assert len([l for l in text.splitlines() if STARTED.match(l)]) == 1  # never restarted
    print(f"a server joined at step {joined}, one SIGKILLed at step {at} of 600: every update "
          f"applied once")
