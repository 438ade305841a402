"""Several hosts without Kubernetes, as docs/python.md tells a user to run them: two network
namespaces joined by a veth pair stand for two hosts. Host A runs the job's etcd on its veth
address and `edl run --etcd ... --replicas 1` (the spec, the job server and one agent); host B
runs one `edl-agent --etcd ...` against that etcd. examples/python/train_elastic.py forms one
world of 2 across the hosts (gloo over the veth), finishes, and both hosts hold the weights a
single process computes. Needs root and `ip netns` (iproute2); skipped, saying so, without.
Only the namespaces' own addresses are used, and the test deletes what it made."""
import os
import shutil
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

from conftest import BIN_DIR, SOURCE_DIR, stop, wait_for
from test_torch_elastic import FORMED, assert_close, env, local_weights

TRAINER = os.path.join(SOURCE_DIR, "examples", "python", "train_elastic.py")
ARGS = ["--epochs", "2", "--samples", "1024", "--batch", "64"]
NET = "10.213.77"  # the veth pair's /24: it exists only between the two namespaces


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


@pytest.fixture
def hosts():
    """{"a": (namespace, interface, address), "b": ...}: two namespaces joined by a veth."""
    if os.geteuid() != 0:
        pytest.skip("two hosts as network namespaces need root (ip netns add)")
    if not shutil.which("ip"):
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    tag = f"{os.getpid() % 100000}"
    made = {h: (f"edl-mh{h}-{tag}", f"edl{h}{tag}", f"{NET}.{i + 1}")
            for i, h in enumerate("ab")}
    first = ip("netns", "add", made["a"][0], check=False)
    if first.returncode != 0:
        pytest.skip(f"network namespaces are not available here: {first.stderr.strip()}")
    try:
        ip("netns", "add", made["b"][0])
        ip("link", "add", made["a"][1], "type", "veth", "peer", "name", made["b"][1])
        for ns, dev, addr in made.values():
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield made
    finally:
        for ns, _, _ in made.values():  # deleting a namespace deletes its end of the pair
            ip("netns", "del", ns, check=False)


def in_ns(ns, argv, log, extra_env):
    e = env()
    e.update(extra_env)
    return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=log,
                            stderr=subprocess.STDOUT, env=e, start_new_session=True)


@pytest.mark.whole_job
def test_agents_on_two_hosts_form_one_world_through_one_etcd(hosts, tmp_path):
    (ns_a, dev_a, addr_a), (ns_b, dev_b, addr_b) = hosts["a"], hosts["b"]
    etcd_url = f"http://{addr_a}:2379"
    secret = tmp_path / "job.secret"  # the same file on every host (scp it there)
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    procs, logs = [], {}

    def start(name, ns, argv, **extra):
        logs[name] = tmp_path / f"{name}.log"
        procs.append(in_ns(ns, argv, open(logs[name], "w"), extra))
        return procs[-1]

    def text(name):
        return logs[name].read_text(errors="replace")

    try:
        etcd = start("etcd", ns_a, [
            shutil.which("etcd") or "/usr/bin/etcd", "--data-dir", str(tmp_path / "etcd"),
            "--name", "a", "--listen-client-urls", etcd_url, "--advertise-client-urls",
            etcd_url, "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380", "--initial-cluster",
            "a=http://127.0.0.1:2380"])
        wait_for(lambda: ip("netns", "exec", ns_b, "curl", "-sf", f"{etcd_url}/health",
                            check=False).returncode == 0 or etcd.poll() is not None, 30,
                 "etcd answering on host A's address from host B")
        assert etcd.poll() is None, text("etcd")[-2000:]
        # the host name resolves to 127.0.0.1 here: gloo is told the interface peers reach
        # (GLOO_SOCKET_IFNAME), as docs/python.md says; without it the ranks connect to
        # 127.0.0.1 and the job keeps re-forming
        common = {"EDL_JOB_SECRET_FILE": str(secret)}
        # host A: the spec, the job server and one agent (its trainers reached at POD_IP)
        run = start("host-a", ns_a, [
            os.path.join(BIN_DIR, "edl"), "run", "--etcd", etcd_url, "--job", "mh",
            "--np", "2", "--replicas", "1", "--elastic-mode", "inprocess", "--ttl", "3",
            "--", sys.executable, TRAINER, *ARGS, "--out", str(tmp_path / "a.pt")],
            POD_IP=addr_a, GLOO_SOCKET_IFNAME=dev_a, **common)
        status = [os.path.join(BIN_DIR, "edl"), "status", "mh", "--etcd", etcd_url]
        wait_for(lambda: ip("netns", "exec", ns_b, *status, check=False).returncode == 0 or
                 run.poll() is not None, 30, "the job's spec in etcd")
        # host B: one agent, once the job is there (edl run clears the job's keys at start)
        agent = start("host-b", ns_b, [
            os.path.join(BIN_DIR, "edl-agent"), "--etcd", etcd_url, "--job", "mh",
            "--addr", addr_b, "--pod", "host-b", "--",
            sys.executable, TRAINER, *ARGS, "--out", str(tmp_path / "b.pt")],
            GLOO_SOCKET_IFNAME=dev_b, **common)
        assert run.wait(240) == 0, text("host-a")[-4000:] + text("host-b")[-3000:]
        assert agent.wait(60) == 0, text("host-b")[-3000:]
    finally:
        for p in reversed(procs):
            stop(p)
    a, b = text("host-a"), text("host-b")
    worlds_a = [m for m in (FORMED.match(line) for line in a.splitlines()) if m]
    assert any(m[4] == "2" for m in worlds_a), a[-3000:]
    worlds_b = [line for line in b.splitlines() if "edl.torch: generation" in line]
    assert any(line.split(" of ")[1].startswith("2 ") for line in worlds_b), b[-3000:]
    assert "final loss" in b
    local = local_weights(tmp_path, ARGS)
    assert_close(local, torch.load(tmp_path / "a.pt"))
    assert_close(local, torch.load(tmp_path / "b.pt"))
