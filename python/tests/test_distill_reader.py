"""edl.distill.Reader against examples/distill's C teachers (real processes, a real etcd): the
teachers of a service found in etcd, one SIGKILLed while the reader runs (every batch yielded
once, in order when asked, with the predictions a healthy run gives); teachers answering
another shape or values past the student's bound (bad replies, the batches sent elsewhere,
the retries reported to the agent); and bad input raising exceptions that say what is wrong."""
import json
import os
import signal
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import edl
import edl.distill as ed
from conftest import BIN_DIR, free_port, stop

TEACHER = os.path.join(os.path.dirname(BIN_DIR), "examples", "distill")
ROWS, BATCHES = 16, 200


@pytest.fixture
def teachers(tmp_path):
    """start(n) -> ["http://127.0.0.1:port", ...], [Popen]: examples/distill teachers, each
    taking at least 5 ms a batch."""
    if not os.path.exists(TEACHER):
        pytest.skip(f"{TEACHER} is not built (cmake --build build --target distill)")
    procs = []

    def start(n):
        urls = []
        for _ in range(n):
            port = free_port()
            log = open(tmp_path / f"teacher-{port}.log", "w")
            procs.append((subprocess.Popen([TEACHER, "--role", "teacher", "--port", str(port),
                                            "--service-time-ms", "5"], stdout=log,
                                           stderr=subprocess.STDOUT), log))
            urls.append(f"http://127.0.0.1:{port}")
        for u in urls:
            edl._edl.wait_listening("127.0.0.1", int(u.rsplit(":", 1)[1]), 30000)
        return urls, [p for p, _ in procs[-n:]]

    yield start
    for p, log in procs:
        stop(p)
        log.close()


def inputs():
    x = np.random.default_rng(7).uniform(-1, 1, (BATCHES * ROWS, 16)).astype(np.float32)
    return [(x[i * ROWS:(i + 1) * ROWS], i) for i in range(BATCHES)]


def reference(urls):
    return {i: p.copy() for (_, i), p in ed.Reader(None, inputs(), teachers=urls, cols=4)}


def service(etcd, *args):
    subprocess.run([os.path.join(BIN_DIR, "edl"), "service", *args, "--etcd", etcd],
                   check=True, timeout=30, stdout=subprocess.DEVNULL)


@pytest.mark.parametrize("ordered", [True, False])
def test_every_batch_once_while_a_teacher_of_the_service_is_killed(teachers, etcd, monkeypatch,
                                                                   ordered):
    urls, procs = teachers(3)
    want = reference(urls[:1])
    monkeypatch.setenv("EDL_ETCD_ENDPOINTS", etcd)
    for i, u in enumerate(urls):
        service(etcd, "register", "--service", "mlp", "--instance", f"t-{i}", "--endpoint", u)
    reader = ed.Reader("mlp", inputs(), cols=4, max_abs=1, ordered=ordered, in_flight=2,
                       student="student-0")
    got = []
    for (x, i), p in reader:
        got.append(i)
        assert p.shape == (ROWS, 4) and np.array_equal(p, want[i]), f"batch {i}"
        if len(got) == 20:
            assert len(reader.teachers) == 3, reader.teachers
            procs[1].send_signal(signal.SIGKILL)  # its tries fail and go to the others
        if len(got) == 60:  # then its record goes, as its agent would delete it
            service(etcd, "deregister", "--service", "mlp", "--instance", "t-1")
    st = reader.stats
    reader.close()
    assert sorted(got) == list(range(BATCHES)), "a batch lost or twice"
    if ordered:
        assert got == list(range(BATCHES))
    assert st["delivered"] == BATCHES and st["failed"] == 0, st
    assert st["conn_errors"] >= 1 and st["retried"] >= 1, st  # the dead teacher was tried
    assert urls[1] not in reader.teachers and len(reader.teachers) == 2, reader.teachers
    print(f"ordered={ordered}: {BATCHES} batches once; {st}")


class _BadTeacher(BaseHTTPRequestHandler):
    """Answers every predict with `cols` columns of `value` (TensorFlow Serving's JSON)."""
    protocol_version = "HTTP/1.1"
    cols, value = 7, 0.25

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = json.dumps({"predictions": [[self.value] * self.cols
                                            for _ in body["instances"]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def bad_teacher(cols, value):
    handler = type("Bad", (_BadTeacher,), {"cols": cols, "value": value})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def agent_progress(monkeypatch):
    """The progress pipe an agent gives its trainer: read() -> the lines written so far, once
    the process's link (this test's) is closed."""
    progress_r, progress_w = os.pipe()
    monkeypatch.setenv("EDL_PROGRESS_FD", str(progress_w))
    monkeypatch.delenv("EDL_CONTROL_FD", raising=False)
    monkeypatch.setattr(edl, "_the_link", None)

    def read():
        edl._the_link.close()  # and the pipe's write end with it
        with os.fdopen(progress_r, "rb") as f:
            return f.read().decode().splitlines()
    return read


def test_replies_of_another_shape_or_past_the_bound_are_bad_replies(teachers, agent_progress):
    urls, _ = teachers(1)
    want = reference(urls)
    wide, wide_url = bad_teacher(7, 0.25)    # another shape than the student states
    big, big_url = bad_teacher(4, 3e38)      # past max_abs
    try:
        reader = ed.Reader(None, inputs(), teachers=[wide_url, big_url, urls[0]], cols=4,
                           max_abs=1, format="json")
        got = {i: p for (_, i), p in reader}
        st = reader.stats
    finally:
        wide.shutdown()
        big.shutdown()
    assert sorted(got) == list(range(BATCHES))
    for i, p in got.items():
        assert np.allclose(p, want[i], atol=1e-6), f"batch {i}: not the good teacher's"
    assert st["bad_replies"] >= 2 and st["failed"] == 0, st
    # the agent heard of the batches in flight and the retries: at the end, none and all
    lines = agent_progress()
    assert lines and all(line.startswith("distill ") for line in lines), lines
    assert lines[-1] == f"distill 0 {st['retried']}" and st["retried"] >= 2, (lines, st)


def test_bad_input_raises_exceptions_that_say_what_is_wrong(teachers, monkeypatch):
    monkeypatch.delenv("EDL_SERVICE", raising=False)
    monkeypatch.delenv("EDL_TEACHERS", raising=False)
    urls, _ = teachers(1)
    x = np.zeros((4, 16), np.float32)
    cases = [
        (ValueError, "no teachers", lambda: ed.Reader(None, [x])),
        (TypeError, "give the batches", lambda: ed.Reader(None, teachers=urls)),
        (ValueError, "binary or json", lambda: ed.Reader(None, [x], teachers=urls,
                                                         format="xml")),
        (TypeError, "float64; want float32", lambda: list(ed.Reader(None, [x.astype(float)],
                                                                    teachers=urls))),
        (ValueError, "want \\(rows, features\\)", lambda: list(ed.Reader(None, [x[0]],
                                                                         teachers=urls))),
        (ValueError, "not contiguous", lambda: list(ed.Reader(None, [x[:, ::2]],
                                                              teachers=urls))),
        (ValueError, "1..65536 rows", lambda: list(ed.Reader(None, [x[:0]], teachers=urls))),
        (ValueError, "DNS label", lambda: list(ed.Reader("Not_A_Label", [x]))),
    ]
    for exc, words, call in cases:
        with pytest.raises(exc, match=words):
            call()
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(edl.Error, match="batch 0: no teacher answered it well in 2 tries") as e:
        list(ed.Reader(None, [x], teachers=[dead], max_tries=2))
    assert e.value.name == "EDL_EPEER"
    assert f"in 2 tries: {dead}: " in str(e.value), str(e.value)  # the teacher, and what it did
    with pytest.raises(edl.Error, match="no batch answered") as e:
        list(ed.Reader(None, [x], teachers=[dead], max_tries=1000, wait_s=1))
    assert e.value.name == "EDL_ETIMEDOUT"
