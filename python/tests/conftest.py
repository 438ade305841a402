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


@pytest.fixture
def etcd(tmp_path):
    """A real etcd on free loopback ports: its client URL."""
    exe = shutil.which("etcd") or "/usr/bin/etcd"
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    log = open(tmp_path / "etcd.log", "w")
    proc = subprocess.Popen([exe, "--data-dir", str(tmp_path / "etcd"), "--name", "t",
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"t=http://127.0.0.1:{peer}"],
                            stdout=log, stderr=subprocess.STDOUT)

    def healthy():
        try:
            return urllib.request.urlopen(url + "/health", timeout=1).status == 200
        except OSError:
            return False

    wait_for(healthy, 20, "etcd")
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
    port = free_port()
    data = tmp_path / "s3data"
    data.mkdir()
    log = open(tmp_path / "s3rver.log", "w")
    proc = subprocess.Popen([node, js, "-d", str(data), "-a", "127.0.0.1", "-p", str(port),
                             "--service-endpoint", "localhost", "--configure-bucket",
                             "edl-test"], stdout=log, stderr=subprocess.STDOUT)

    def up():
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/edl-test", timeout=1)
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    wait_for(up, 30, "s3rver")
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
