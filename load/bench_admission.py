"""Benchmark: the balancer's decision for one job under a tenancy file (quota, placement, preemption), as its
mirror makes it (through the mirror's index, over its view), against the same admission over a copied snapshot
with the policy itself. Not a test: it prints medians in microseconds.

    .venv/bin/python load/bench_admission.py                 # 1,000 and 10,000 GPUs
    .venv/bin/python load/bench_admission.py --sizes 1000 --jobs 100

Each timed decision is followed by its placement applied to the mirror, as the balancer applies it, so the next
one sees a changed mirror (the index keys the changed GPU again; a snapshot is copied again).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from load.bench_placement import cluster  # noqa: E402
from services.balancer.candidate import Candidate  # noqa: E402
from services.balancer.decide import Decider, DecisionMetrics  # noqa: E402
from services.balancer.mirror import reservation_instance  # noqa: E402
from services.balancer.preempting import admit_job  # noqa: E402
from services.balancer.shards import Shards  # noqa: E402
from services.balancer.tenancy import TenantLedger  # noqa: E402
from shared.events import Demand, JobSubmit  # noqa: E402
from shared.mig.geometry import default_geometry  # noqa: E402
from shared.policy.admission import Start  # noqa: E402
from shared.policy.placement.balancer import BalancerParams  # noqa: E402
from shared.policy.placement.registry import get_policy  # noqa: E402
from shared.policy.reservation import ReservationParams  # noqa: E402
from shared.state import StoredGpu, StoredInstance  # noqa: E402

TENANCY = '[priority_classes.normal]\nvalue = 100\ndefault = true\n\n[tenants.team]\n'
NOW = 1e6


def decider(n: int, folder: Path) -> Decider:
    geo = default_geometry()
    path = folder / "tenancy.toml"
    path.write_text(TENANCY)
    ledger = TenantLedger(str(path), 0, poll_s=0.0, geometry=geo)
    shards = Shards(1, geo, ReservationParams(), ledger)
    for g in cluster(n).gpus:
        shards.mirrors[0].put(StoredGpu(
            id=g.id, node=g.node, index=g.index, model=g.model, mig=g.mig, healthy=g.healthy,
            instances=[StoredInstance(id=i.id, profile=i.profile, start=i.start, size=i.size, compute=i.compute,
                                      state="idle" if i.job_id is None else "busy", job=i.job_id)
                       for i in g.instances]))
    ledger.rebuild([shards.mirrors[0].snapshot()])
    return Decider(shards, ledger, BalancerParams(), get_policy("migsched")[1], True, geo, DecisionMetrics())


def run(n: int, jobs: int, through_index: bool, folder: Path) -> tuple[float, list[object]]:
    """(median µs, each decision's slots or hold reason): both ways decide alike, so only their cost differs."""
    d = decider(n, folder)
    mirror = d.shards.mirrors[0]
    rng = random.Random(1)
    times = []
    chosen: list[object] = []
    for k in range(jobs):
        sub = JobSubmit(id=f"s{k}", job_id=f"j{k}", demand=Demand(kind="mig", profile=rng.choice(["1g", "2g", "3g"])),
                        tenant="team", duration_hint_s=rng.choice([60.0, 900.0, 7200.0]), submitted_at=NOW)
        c = Candidate(submit=sub, spec=b"{}", ctx=None)
        t0 = time.perf_counter_ns()
        if through_index:
            got = d._admit(0, c, frozenset(), {}, NOW)
        else:
            got = admit_job(d.ledger, mirror.snapshot(), c, d.params, NOW, {}, d.policy)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
        assert not isinstance(got, str)
        chosen.append(got[2].placement.slots if isinstance(got[2], Start) else got[2].reason)
        if isinstance(got[2], Start):
            for s in got[2].placement.slots:
                mirror.apply(s, sub.job_id, reservation_instance(s, sub.job_id, 0, "team", False, True))
    return statistics.median(times), chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--jobs", type=int, default=300, help="decisions timed per size and way")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print("| GPUs | over a copied snapshot, median µs | through the mirror's index, median µs |")
        print("|---:|---:|---:|")
        for n in a.sizes:
            slow, was = run(n, a.jobs, False, Path(tmp))
            fast, now = run(n, a.jobs, True, Path(tmp))
            if was != now:
                raise SystemExit(f"{n} GPUs: the two ways decided differently")
            print(f"| {n:,} | {slow:.0f} | {fast:.0f} |")


if __name__ == "__main__":
    main()
