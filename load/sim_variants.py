"""Policy variants on one trace: one simulator run per (label, policy, parameters), one line of KPIs each.

    .venv/bin/python load/sim_variants.py default 40 \
        '[["migsched", "migsched", {}], ["delta", "migsched", {"rank": "delta", "lazy_first": false}]]'
    .venv/bin/python load/sim_variants.py synthetic 64 '[["ff", "first-fit", {}]]' --jobs 20000

The trace is an openb variant (default, gpushare60, ...) or ``synthetic`` (offered load 1.0, seed 0); the
parameters are those ``get_policy`` accepts (docs/results-sim.md, "Policy variants").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import numpy as np

from shared.mig.geometry import default_geometry
from shared.policy.registry import get_policy
from shared.sim import experiment
from shared.sim.cluster import parse_cluster
from shared.sim.config import SimConfig
from shared.sim.engine import Simulator
from shared.sim.workloads.openb import load_openb
from shared.sim.workloads.synthetic import synthetic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("gpus", type=int)
    ap.add_argument("variants", help="JSON list of [label, policy, {param: value}]")
    ap.add_argument("--jobs", type=int, default=20000, help="synthetic only")
    a = ap.parse_args()
    geo = default_geometry()
    cfg = SimConfig()
    if a.trace == "synthetic":
        wl = synthetic(np.random.default_rng(cfg.seed), jobs=a.jobs, load=1.0, cluster_slices=a.gpus * 7)
    else:
        wl = load_openb(a.trace, geo.model("A100-40GB"))
    cluster = parse_cluster([f"A100-40GB:{a.gpus}"], geo, 8)
    for label, name, extra in json.loads(a.variants):
        spec, pol = get_policy(name, **{**experiment.policy_params(name, wl, cfg), **extra})
        if name in experiment.LAYOUT_POLICIES:
            spec = msgspec.structs.replace(spec, initial_layout=cfg.static_layout)
        k = Simulator(wl, cluster, spec, pol, cfg, geometry=geo).run().kpis
        print(f"{a.trace} {a.gpus} {label}: rej={k.rejection_rate:.4f} jct_mean_h={k.jct_mean_s / 3600:.3f} "
              f"p50_s={k.jct_p50_s:.0f} wait_s={k.wait_mean_s:.0f} util={k.utilization:.3f} "
              f"frag_peak={k.frag_rate_peak:.3f} migrations={k.migrations}", flush=True)


if __name__ == "__main__":
    main()
