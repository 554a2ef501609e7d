"""Migration planner timing on the placement benchmark's random clusters (``bench_placement.cluster``).

    .venv/bin/python load/bench_planner.py 1000          # this tree
    .venv/bin/python load/bench_planner.py 10000 /tmp/before   # another checkout of the tree, same venv

Prints the median and minimum of repeated ``plan_after_exit`` (on a partly used Lazy GPU) and ``plan_defrag``
calls. Interleave runs of two trees to compare them on a shared machine: single runs vary by 2x.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

root = sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).resolve().parents[1])
sys.path.insert(0, root)
sys.path.insert(0, root + "/load")

import bench_placement as bp  # noqa: E402
import numpy as np  # noqa: E402

from shared.policy.migration import MigrationParams, plan_after_exit, plan_defrag  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    snap = bp.cluster(n)
    mp = MigrationParams()
    load = np.asarray(snap.used) / np.maximum(np.asarray(snap.compute), 1)
    target = snap.gpus[int(np.flatnonzero((load < 0.4) & (np.asarray(snap.busy) != 0))[0])].id
    calls = {"plan_after_exit": lambda: plan_after_exit(snap, target, 1e6, mp),
             "plan_defrag": lambda: plan_defrag(snap, 1e6, mp)}
    for name, fn in calls.items():
        fn()
        ts = []
        for _ in range(15 if n > 5000 else 40):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        print(f"{root} {n} GPUs {name}: median {statistics.median(ts) * 1e6:.0f} us, "
              f"min {min(ts) * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
