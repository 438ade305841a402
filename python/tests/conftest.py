"""Fixtures of the edl package's tests: a real etcd on free loopback ports, a real s3rver,
and the build tree's binaries (ctest passes EDL_BIN_DIR, EDL_SOURCE_DIR and PYTHONPATH; see
python/CMakeLists.txt). Every process a test starts is stopped when it ends.

A test marked whole_job starts a job of Python trainer processes (each imports torch) or builds
the package again; ctest's sanitized build (EDL_SANITIZED=1) skips those: under ASan's runtime
each trainer's start takes tens of seconds, the plain pass runs the same jobs, and the tests
that drive the module in this process are the ones the sanitizers watch."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

SOURCE_DIR = os.environ.get("EDL_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BIN_DIR = os.environ.get("EDL_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))


def pytest_configure(config):
    config.addinivalue_line("markers", "whole_job: starts a job of Python trainer processes or "
                            "builds the package (skipped in the sanitized build)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("EDL_SANITIZED") != "1":
        return
    skip = pytest.mark.skip(reason="whole_job, left to the plain build (see conftest.py)")
    for item in items:
        if "whole_job" in item.keywords:
            item.add_marker(skip)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop(proc, grace=5):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_server(tmp_path, name, plan, ready, timeout):
    """Start a server whose ports are chosen by plan() -> (argv, address) and wait until
    ready(address). A server that exits first (its port taken meanwhile by another process:
    free_port() only proposes one) is started again on new ports, up to three times; a failure
    names the server and shows the end of its log. Returns (process, log file, address)."""
    for attempt in range(1, 4):
        argv, address = plan()
        path = tmp_path / f"{name}-{attempt}.log"
        log = open(path, "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < end:
            if ready(address):
                return proc, log, address
            time.sleep(0.05)
        exited = proc.poll() is not None
        stop(proc)
        log.close()
        tail = path.read_text(errors="replace")[-2000:]
        if not exited or attempt == 3:
            why = f"exited ({proc.returncode})" if exited else f"not ready in {timeout} s"
            raise AssertionError(f"{name} {why} at attempt {attempt}; its log ends:\n{tail}")
    raise AssertionError("unreachable")


@pytest.fixture
def etcd(tmp_path):
    """A real etcd on free loopback ports: its client URL."""
    exe = shutil.which("etcd") or "/usr/bin/etcd"

    def plan():
        client, peer = free_port(), free_port()
        url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        data = tmp_path / f"etcd-{client}"
        return [exe, "--data-dir", str(data), "--name", "t", "--listen-client-urls", url,
                "--advertise-client-urls", url, "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
                f"t={peer_url}"], url

    def healthy(url):
        try:
            return urllib.request.urlopen(url + "/health", timeout=1).status == 200
        except OSError:
            return False

    proc, log, url = start_server(tmp_path, "etcd", plan, healthy, 30)
    yield url
    stop(proc)
    log.close()


@pytest.fixture
def in_job(etcd, monkeypatch):
    """This process as a trainer of job "pyjob" (the variables an agent sets): etcd's URL."""
    monkeypatch.setenv("EDL_JOB_ID", "pyjob")
    monkeypatch.setenv("EDL_ETCD_ENDPOINTS", etcd)
    monkeypatch.delenv("EDL_ETCD_PREFIX", raising=False)
    return etcd


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A real s3rver (npm; scripts/install-deps puts it in tests/.s3rver) with bucket
    edl-test: the AWS_* variables point at it."""
    js = os.path.join(SOURCE_DIR, "tests/.s3rver/node_modules/s3rver/bin/s3rver.js")
    node = shutil.which("node") or shutil.which("nodejs")
    if not node or not os.path.exists(js):
        pytest.skip("s3rver is not installed (scripts/install-deps)")
    data = tmp_path / "s3data"
    data.mkdir()

    def plan():
        port = free_port()
        return [node, js, "-d", str(data), "-a", "127.0.0.1", "-p", str(port),
                "--service-endpoint", "localhost", "--configure-bucket", "edl-test"], port

    def up(port):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/edl-test", timeout=1)
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    proc, log, port = start_server(tmp_path, "s3rver", plan, up, 30)
    for k, v in {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "S3RVER",
                 "AWS_SECRET_ACCESS_KEY": "S3RVER", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    yield f"s3://edl-test/{os.getpid()}-{time.monotonic_ns()}"
    stop(proc)
    log.close()


@pytest.fixture
def scratch():
    d = tempfile.mkdtemp(prefix="edl-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ps_secret(tmp_path, monkeypatch):
    """A job secret in a 0600 file, named by EDL_JOB_SECRET_FILE for every process started."""
    path = tmp_path / "job.secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    monkeypatch.setenv("EDL_JOB_SECRET_FILE", str(path))
    return str(path)


@pytest.fixture
def ps_servers(ps_secret, tmp_path):
    """start(n, job="pyjob") -> ["127.0.0.1:port", ...]: n edl-ps processes of the build tree,
    serving once this returns; stopped when the test ends."""
    from edl import _edl
    procs = []

    def start(n, job="pyjob"):
        eps = []
        for _ in range(n):
            port = free_port()
            log = open(tmp_path / f"edl-ps-{port}.log", "w")
            procs.append((subprocess.Popen([os.path.join(BIN_DIR, "edl-ps"), "--port",
                                            str(port), "--job", job, "--threads", "2"],
                                           stdout=log, stderr=subprocess.STDOUT), log))
            eps.append(f"127.0.0.1:{port}")
        for ep in eps:
            _edl.wait_listening("127.0.0.1", int(ep.split(":")[1]), 20000)
        return eps

    yield start
    for proc, log in procs:
        stop(proc)
        log.close()
