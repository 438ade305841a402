"""ps_counting.py: a PyTorch trainer whose every update is a count, for
test_ps_elastic.py. Both Fleet roles, as examples/python/ctr.py: under `edl run --ps` a server
serves (edl.fleet.run_server) and writes its pid to OUT/server.<pod>; a worker trains a
SparseEmbedding (sum of each example's 3 ids, SGD at lr 1 from zero) with loss = the sum of its
outputs, so every id's row moves by -1 for each time it appears, and pushes 1 to each of 64
dense elements a step: after a flush, a row that is not minus its count (a push lost, or applied
twice) shows. It writes its step to OUT/step.<pod> as it goes, then checks every value.

    ps_counting.py --out DIR [--steps 400] [--step-ms 10] [--replicas 2]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

import edl.fleet as fleet
import edl.ps as ps
from edl.torch import SparseEmbedding

IDS, DENSE = 1000, 64


def main(a):
    fleet.init()
    pod = os.environ.get("EDL_POD_ID", "pod")
    if fleet.is_server():
        with open(os.path.join(a.out, f"server.{pod}.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(a.out, f"server.{pod}.tmp"), os.path.join(a.out, f"server.{pod}"))
        fleet.run_server()
        return 0
    fleet.init_worker()
    emb = SparseEmbedding(0, 4, mode="sum", optimizer="sgd", lr=1.0, init="zero",
                          replicas=a.replicas)
    dense = ps.DenseTable(1, DENSE, optimizer="sgd", lr=1.0, replicas=a.replicas)
    counts, ones = np.zeros(IDS, np.int64), np.ones(DENSE, np.float32)
    rng = np.random.default_rng(fleet.worker_index())
    for step in range(a.steps):
        ids = rng.integers(0, IDS, size=(32, 3))
        emb(torch.from_numpy(ids)).sum().backward()  # pushes 1 per appearance of each id
        np.add.at(counts, ids.ravel(), 1)
        dense.push(ones)
        fleet.step()
        with open(os.path.join(a.out, f"step.{pod}.tmp"), "w") as f:
            f.write(str(step + 1))
        os.replace(os.path.join(a.out, f"step.{pod}.tmp"), os.path.join(a.out, f"step.{pod}"))
        time.sleep(a.step_ms / 1000)
    fleet.worker().flush()  # every push acknowledged: applied on every holder of its shard
    rows = emb.table.pull(torch.arange(IDS), direct=True).numpy()
    got_dense = dense.pull(direct=True)
    lost = int((rows != -counts[:, None].astype(np.float32)).any(axis=1).sum())
    dense_off = int((got_dense != -float(a.steps)).sum())
    print(f"ps_counting: {a.steps} steps, {int(counts.sum())} updates of {IDS} rows: {lost} rows "
          f"and {dense_off} dense elements not as counted", flush=True)
    fleet.stop_worker()
    return 0 if lost == 0 and dense_off == 0 else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-ms", type=float, default=10)
    p.add_argument("--replicas", type=int, default=2)
    sys.exit(main(p.parse_args()))
