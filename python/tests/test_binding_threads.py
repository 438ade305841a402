"""The module's objects used from several threads at once, as a trainer with a helper thread
uses them: a call that waits with the GIL released keeps its object alive and whole while
another thread closes it, follows a service or reads its counters (edl._edl.Link and
edl._edl.Distill; ps.c's calls/EDL_EBUSY guard is the pattern). Under the sanitized build these
run in this process, where ASan sees a use after free."""
import array
import os
import socket
import threading
import time

import pytest

import edl
from edl import _edl


@pytest.fixture
def agent_pipes(monkeypatch):
    """The pipes an agent hands its trainer: (the agent's end of control, of progress)."""
    control_r, control_w = os.pipe()
    progress_r, progress_w = os.pipe()
    monkeypatch.setenv("EDL_CONTROL_FD", str(control_r))
    monkeypatch.setenv("EDL_PROGRESS_FD", str(progress_w))
    yield control_w, progress_r
    os.close(control_w)
    os.close(progress_r)


def waiting(thread_call, deadline_s=10):
    """Start thread_call in a thread; return (thread, results) once it is under way."""
    results, started = [], threading.Event()

    def run():
        started.set()
        try:
            results.append(thread_call())
        except Exception as e:  # noqa: BLE001 - the test looks at what it raised
            results.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(deadline_s)
    return t, results


def test_a_link_refuses_close_while_another_thread_waits_on_it(agent_pipes):
    control_w, _ = agent_pipes
    link = _edl.Link()
    assert link.active
    t, results = waiting(lambda: link.wait(5000))
    time.sleep(0.2)  # let wait() reach its poll with the GIL released (its 200 ms slices)
    with pytest.raises(edl.Error) as e:
        link.close()
    assert e.value.name == "EDL_EBUSY" and "wait()" in str(e.value)
    # the waiting call still has its link: a generation announced now reaches it
    os.write(control_w, b'{"generation":3,"rank":1,"world_size":2,"master_addr":"127.0.0.1",'
                        b'"master_port":29500}\n')
    t.join(10)
    assert not t.is_alive()
    assert isinstance(results[0], dict) and results[0]["generation"] == 3, results
    link.close()  # nothing waits now
    with pytest.raises(edl.Error) as e:
        link.wait(0)
    assert e.value.name == "EDL_ECLOSED"


def test_two_concurrent_follows_give_one_discovery(in_job):
    d = _edl.Distill(cols=4)
    go = threading.Barrier(2)
    results = []

    def follow():
        go.wait()
        try:
            d.follow("teachers", "student-a")
            results.append("ok")
        except edl.Error as e:
            results.append(e)

    threads = [threading.Thread(target=follow) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(map(str, results)).count("ok") == 1, results
    refused = next(r for r in results if r != "ok")
    assert refused.name == "EDL_EINVAL" and "follows a service already" in str(refused)
    d.close()


def test_counters_are_read_while_next_waits_in_another_thread():
    # pending() and stats() read the counters next() changes: they read what the last call
    # left, never the client's own while next() runs (a data race only TSan sees) and never
    # wait for next() to return
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the backlog; nothing ever answers
    d = _edl.Distill(cols=4, timeout_ms=60000)
    d.set_teachers([f"http://127.0.0.1:{silent.getsockname()[1]}"])
    x = array.array("f", [0.5] * 8)
    d.submit(x.buffer_info()[0], 32, 2, 4)
    t, results = waiting(lambda: d.next(1500))
    time.sleep(0.2)
    start = time.monotonic()
    for _ in range(1000):
        assert d.pending() == 1
        st = d.stats()
        assert st["submitted"] == 1 and st["delivered"] == 0
    assert time.monotonic() - start < 1.0, "pending()/stats() waited for next()"
    t.join(10)
    assert not t.is_alive() and results == [None]
    d.close()
    silent.close()
