"""How `edl run` judges a trainer's failure, for real (docs/elastic.md, "How failures are
judged"): a Python exception at step 50 fails the job at once with the exception in `edl run`'s
last line, in process (edl.torch marks it as the script's own) and in restart mode (edl.torch's
mark, or for a plain script the same rank failing the same way twice in a row); an edl.torch
trainer run without --elastic-mode re-forms in process, and still after its trainer is
SIGKILLed (a failure from outside)."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import BIN_DIR, SOURCE_DIR, stop, wait_for

pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "raise_at_step.py")
FORMED = re.compile(r"^\[(?:rank \d+ )?(\S+)\] edl\.torch: generation (\d+): rank (\d+) of (\d+) \(pid (\d+)\)")


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e


def edl_run(tmp_path, name, opts, trainer, timeout=60):
    """Run `edl run` to its end: (exit code, seconds, its output)."""
    log = tmp_path / f"{name}.log"
    cmd = [os.path.join(BIN_DIR, "edl"), "run", "--job", name, "--settle-ms", "300", *opts,
           "--", sys.executable, *trainer]
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(),
                                start_new_session=True)
        try:
            rc = proc.wait(timeout)
        finally:
            stop(proc)
    return rc, time.monotonic() - t0, log.read_text(errors="replace")


def last_line(text):
    return text.rstrip("\n").splitlines()[-1]


@pytest.mark.whole_job
@pytest.mark.parametrize("mode", [[], ["--elastic-mode", "restart"]], ids=["inprocess", "restart"])
def test_an_exception_at_step_50_fails_the_job_at_once(tmp_path, mode):
    rc, took, text = edl_run(tmp_path, "pyraise", ["--np", "2", *mode],
                             [SCRIPT, "--at", "50", "--rank", "1"])
    last = last_line(text)
    assert rc == 1, text[-3000:]
    assert "job pyraise failed after" in last, text[-3000:]
    assert "ValueError: boom at step 50" in last, last
    assert "own error" in last and "restart 1 of" not in text, text[-3000:]
    assert took < 30, f"{took:.1f} s\n{text[-3000:]}"
    print(f"edl.torch, ValueError at step 50, {mode or 'no --elastic-mode'}: failed in "
          f"{took:.1f} s: {last}")


@pytest.mark.whole_job
def test_a_plain_script_failing_twice_the_same_way_fails_the_job(tmp_path):
    rc, took, text = edl_run(tmp_path, "plainraise", ["--np", "2", "--ttl", "2"],
                             [SCRIPT, "--plain", "--at", "50", "--rank", "1"])
    last = last_line(text)
    assert rc == 1, text[-3000:]
    assert "restart 1 of 10" in text and "restart 2 of" not in text, text[-3000:]
    assert "rank 1 failed the same way in generation" in last, last
    assert "exited with code 1: last stderr: ValueError: boom at step 50" in last, last
    assert took < 30, f"{took:.1f} s\n{text[-3000:]}"
    print(f"plain script, ValueError at step 50 on rank 1, restart mode: failed in {took:.1f} s")


@pytest.mark.whole_job
def test_edl_torch_without_elastic_mode_reforms_in_process(tmp_path):
    log = tmp_path / "pyauto.log"
    cmd = [os.path.join(BIN_DIR, "edl"), "run", "--job", "pyauto", "--np", "1:3", "--replicas",
           "2", "--settle-ms", "300", "--ttl", "3", "--", sys.executable, SCRIPT, "--at",
           "-1", "--steps", "100000", "--step-ms", "20"]
    f = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env(),
                            start_new_session=True)

    def formed():
        return [(m[1], int(m[2]), int(m[4]), int(m[5])) for m in
                (FORMED.match(line) for line in log.read_text(errors="replace").splitlines())
                if m]

    def world_of(n):
        last = formed()[-n:]
        return len(last) == n and all(x[2] == n for x in last) and len({x[1] for x in last}) == 1

    try:
        wait_for(lambda: world_of(2), 60, "a generation of 2 formed")
        subprocess.run([os.path.join(BIN_DIR, "edl"), "scale", "pyauto", "3"], check=True,
                       env=env(), timeout=60, stdout=subprocess.DEVNULL)
        wait_for(lambda: world_of(3), 60, "a generation of 3 formed")
        victim = [x[3] for x in formed() if x[0] == "pyauto-1"][-1]
        os.kill(victim, signal.SIGKILL)  # from outside: a restart, the survivors re-form
        wait_for(lambda: world_of(3) and victim not in {x[3] for x in formed()[-3:]}, 60,
                 "the killed trainer's replacement in a generation of 3")
        subprocess.run([os.path.join(BIN_DIR, "edl"), "stop", "pyauto"], check=True, env=env(),
                       timeout=60, stdout=subprocess.DEVNULL)
        proc.wait(60)
    finally:
        stop(proc)
        f.close()
    text = log.read_text(errors="replace")
    pids = {x[3] for x in formed() if x[0] == "pyauto-0"}
    assert len(pids) == 1, f"pod 0's trainer was restarted: {formed()}\n{text[-3000:]}"
    assert "re-forming in process as rank" in text, text[-3000:]
    assert "restarting the trainer" not in text, text[-3000:]


def test_the_scripts_own_exception_is_left_in_the_error_file(tmp_path, monkeypatch):
    """Without processes: edl.torch writes the exception, marked as the script's own, where the
    agent reads it (TORCHELASTIC_ERROR_FILE), and raises it unchanged; a communication failure
    or an edl error is not marked."""
    import json

    import torch
    import edl.torch as et
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    state = et.State(model=torch.nn.Linear(2, 1), step=0)

    @et.elastic
    def bad(state):
        raise KeyError("sampler")

    with pytest.raises(KeyError, match="sampler"):
        bad(state)
    doc = json.loads(path.read_text())
    assert doc["edl_own_error"] is True
    assert doc["message"]["message"] == "KeyError: 'sampler'"
    assert "raise KeyError" in doc["message"]["extraInfo"]["py_callstack"]
    path.unlink()

    import edl

    @et.elastic
    def edl_failure(state):
        raise edl._edl.error(edl._edl.EDL_ETIMEDOUT, "etcd did not answer")

    with pytest.raises(edl.Error):
        edl_failure(state)
    assert not path.exists()
