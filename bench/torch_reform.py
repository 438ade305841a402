"""torch_reform.py: how long a PyTorch job takes to train again after a pod joins, leaves or
crashes, in process (edl.torch re-forms the process group in place) against restart mode (the
unmodified torch trainer, restarted in every generation), in one run on this machine.

For each mode it runs bench/torch_reform_trainer.py under `edl run` (its own etcd, job server
and agents), two pods of up to three, and repeats: a join (`edl scale` to 3; "ready" is the same
join timed from the moment the new pod registered, which in process is once its trainer, started
ahead, has loaded Python and torch), a crash (SIGKILL of a pod's agent and trainer; `edl run`
replaces the pod: another join), "tkill" (SIGKILL of a trainer alone, its pod and agent live on:
in process the survivors go on without it at once and its replacement, started ahead, joins when
ready; the row is the time to the world without it), a leave (`edl scale` to 2: in process a
graceful leave at the next commit). Each event is timed from the moment it happened to the new
world's first allreduce (the last rank's), split at the job server's publication of the new
generation (its log line): event -> published is the control plane's part (the settle window for
a join, the detection for a crash), published -> allreduce the trainer's (re-forming, or
restarting Python, torch and the group). Medians and [min, max] over the trials. "rollbacks"
counts the ranks that went back to their last commit because a collective failed (edl.torch's "a
collective failed" line), over all trials: a graceful leave has none.

Goals on a 2-core machine (issue 31): in process, leave <= 0.3 s; join <= settle + 0.3 s;
crash <= detection + 0.3 s; (issue 38) tkill <= 0.5 s; leave with no rollback.

    python3 bench/torch_reform.py [--trials 5] [--build build] [--settle-ms 300] [--ttl 3]
"""
import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PUBLISHED = re.compile(r"^\[jobserver\] (\S+) INFO  jobserver: job \S+: generation (\d+) running")
REGISTERING = re.compile(r"^\[(?:\w+ \d+ )?(\S+)\] (\S+) INFO  agent: registering pod ")
ROLLBACK = re.compile(r"edl\.torch: generation \d+: a collective failed")


def _wall(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Run:
    def __init__(self, args, mode, workdir):
        self.args, self.mode = args, mode
        self.job = f"bench-{mode}"
        self.log = os.path.join(workdir, f"{mode}.log")
        self.edl = os.path.join(args.build, "bin", "edl")
        env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"))
        self.f = open(self.log, "w")
        self.proc = subprocess.Popen(
            [self.edl, "run", "--job", self.job, "--np", "1:3", "--replicas", "2",
             "--elastic-mode", mode, "--settle-ms", str(args.settle_ms), "--ttl", str(args.ttl),
             "--", sys.executable, os.path.join(HERE, "torch_reform_trainer.py"), "--mode",
             mode], stdout=self.f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.env = env

    def lines(self):
        with open(self.log, errors="replace") as f:
            return f.read().splitlines()

    def reports(self):
        out = []
        for line in self.lines():
            _, _, rest = line.partition("] ")
            if rest.startswith("{\"first_allreduce\""):
                out.append(json.loads(rest))
        return out

    def published(self, generation):
        for line in self.lines():
            m = PUBLISHED.match(line)
            if m and int(m[2]) == generation:
                return _wall(m[1])
        return None

    def registered(self, pod):
        """When the pod's agent registered it (its trainer, started ahead, was ready)."""
        for line in self.lines():
            m = REGISTERING.match(line)
            if m and m[1] == pod:
                return _wall(m[2])
        return None

    def world(self, size, after, timeout=90):
        """The first generation after `after` of `size` ranks (None: any size) whose ranks all
        reported their first allreduce: (generation, the last rank's time)."""
        end = time.time() + timeout
        while time.time() < end:
            by_gen, sizes = {}, {}
            for r in self.reports():
                if r["generation"] > after and size in (None, r["world"]):
                    by_gen.setdefault(r["generation"], []).append(r["first_allreduce"])
                    sizes[r["generation"]] = r["world"]
            done = sorted(g for g, ts in by_gen.items() if len(ts) >= sizes[g])
            if done:
                return done[0], max(by_gen[done[0]])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"bench torch_reform: no world of {size} after generation {after} "
                         f"({self.mode}); see {self.log}")

    def scale(self, n):
        t = time.time()
        subprocess.run([self.edl, "scale", self.job, str(n)], check=True, env=self.env,
                       stdout=subprocess.DEVNULL)
        return t

    def rollbacks(self):
        return sum(1 for line in self.lines() if ROLLBACK.search(line))

    def crash(self, pod, trainer_only=False):
        """SIGKILL the pod's agent and trainer (or the trainer alone)."""
        agent = subprocess.run(["pgrep", "-f", f"edl-agent .*--pod {pod} "], capture_output=True,
                               text=True).stdout.split()
        if not agent:
            raise SystemExit(f"bench torch_reform: no agent of {pod}")
        children = subprocess.run(["pgrep", "-P", agent[0]], capture_output=True,
                                  text=True).stdout.split()
        t = time.time()
        for pid in children if trainer_only else [agent[0], *children]:
            os.kill(int(pid), signal.SIGKILL)
        return t

    def stop(self):
        subprocess.run([self.edl, "stop", self.job], env=self.env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=90)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.f.close()


def newest_pod(run):
    pods = sorted({line.split()[0] for line in run.lines()
                   if line.startswith(run.job + "-") and "registered" in line},
                  key=lambda p: int(p.rsplit("-", 1)[1]))
    return pods[-1]


def measure(args, mode, workdir):
    """{event: [(t0, published, done)]} and {event: rollbacks over the trials}."""
    run = Run(args, mode, workdir)
    times = {"join": [], "ready": [], "crash": [], "tkill": [], "leave": []}
    rolled = dict.fromkeys(times, 0)

    def record(event, t0, gen, done, before):
        times[event].append((t0, run.published(gen), done))
        rolled[event] += run.rollbacks() - before

    try:
        gen, _ = run.world(2, 0, timeout=120)
        for _ in range(args.trials):
            before = run.rollbacks()
            t0 = run.scale(3)
            gen, done = run.world(3, gen)
            record("join", t0, gen, done, before)
            times["ready"].append((run.registered(newest_pod(run)), run.published(gen), done))
            for event in ("crash", "tkill"):
                before = run.rollbacks()
                t0 = run.crash(newest_pod(run), trainer_only=event == "tkill")
                gen, done = run.world(None, gen)  # without it (its replacement may be in already)
                record(event, t0, gen, done, before)
                if not run.reports()[-1]["world"] == 3:
                    gen, _ = run.world(3, gen)  # the replacement joins
            before = run.rollbacks()
            t0 = run.scale(2)
            gen, done = run.world(2, gen)
            record("leave", t0, gen, done, before)
    finally:
        run.stop()
    return times, rolled


def summary(samples):
    if not samples:
        return "-"
    med = statistics.median(samples)
    return f"{med:6.3f} s [{min(samples):.3f}, {max(samples):.3f}]"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--settle-ms", type=int, default=300)
    p.add_argument("--ttl", type=int, default=3, help="the agents' lease TTL: crash detection")
    p.add_argument("--modes", default="inprocess,restart")
    args = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="edl-bench-torch-")
    print(f"torch_reform: {args.trials} trials, settle {args.settle_ms} ms, lease TTL {args.ttl} s,"
          f" logs in {workdir}")
    print(f"{'mode':10} {'event':6} {'event -> new world':28} {'event -> published':28} "
          f"{'published -> allreduce':28} rollbacks")
    for mode in args.modes.split(","):
        times, rolled = measure(args, mode, workdir)
        for event, samples in times.items():
            total = [d - t0 for t0, pub, d in samples]
            ctl = [pub - t0 for t0, pub, d in samples if pub]
            trainer = [d - pub for t0, pub, d in samples if pub]
            rb = str(rolled.get(event, "-")) if mode == "inprocess" and event != "ready" else "-"
            print(f"{mode:10} {event:6} {summary(total):28} {summary(ctl):28} "
                  f"{summary(trainer):28} {rb}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
