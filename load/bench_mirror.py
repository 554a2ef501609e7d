"""Benchmark: the balancer mirror's decision path, ``place(mirror.view(), ...)`` (old) vs ``mirror.decide``
(the live placer: ``PlacementIndex`` + key columns, same ``Placement``), in CPU time per decision.

Not a test: it prints figures. Each size runs the same stream twice from the same state, once per path: a
decision for a mixed demand (1g, 2g, 3g, 7g, 2c/20GB), its reservation applied to the mirror as
``decide_and_commit`` does, and one job exit (a release) to keep the occupancy steady. The cluster is
``bench_placement``'s: A100-40GB / H100-80GB / H200-141GB GPUs 50-70 % full, ~20 % of instances idle.
``decide`` is the decision call alone (the old path pays its snapshot view there, as the service does);
``step`` adds the apply and release, where the new path keeps its placer up to date. CPU time is
``time.process_time``; both streams must make identical decisions (checked).

    nice -n 19 .venv/bin/python load/bench_mirror.py                      # 512 and 1,000 GPUs
    nice -n 19 .venv/bin/python load/bench_mirror.py --sizes 512 --decisions 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from load.bench_placement import cluster  # noqa: E402
from services.balancer.mirror import Mirror, reservation_instance  # noqa: E402
from shared.mig.geometry import default_geometry  # noqa: E402
from shared.policy.balancer import BalancerParams, place  # noqa: E402
from shared.policy.placement import Decision, JobRequest, Placement  # noqa: E402
from shared.policy.request import Demand, mig, sized  # noqa: E402
from shared.state import StoredGpu, StoredInstance  # noqa: E402

MIX: tuple[Demand, ...] = (mig("1g"), mig("1g"), mig("2g"), mig("3g"), sized(2, 20), mig("7g"))


def mirror_of(n: int) -> Mirror:
    mirror = Mirror(default_geometry())
    for g in cluster(n).gpus:
        mirror.put(StoredGpu(
            id=g.id, node=g.node, index=g.index, model=g.model,
            instances=[StoredInstance(id=i.id, profile=i.profile, start=i.start, size=i.size, compute=i.compute,
                                      state="idle" if i.job_id is None else "busy", job=i.job_id)
                       for i in g.instances]))
    return mirror


class Figures(NamedTuple):
    decide_us: float
    """CPU µs per decision call, every decision."""
    placed_us: float
    """The same over the decisions that placed the job."""
    refused_us: float
    """The same over the decisions that could not (both paths answer those with ``place``)."""
    step_us: float
    """CPU µs per step: the decision, its reservation applied and one release."""
    decisions: list[Decision]


def timer_cost(clock: Callable[[], float] = time.process_time, n: int = 20000) -> float:
    """Seconds one clock read adds to a timed interval (subtracted from each interval)."""
    t0 = clock()
    for _ in range(n):
        clock()
    return (clock() - t0) / n


def run(mirror: Mirror, decide: Callable[[Mirror, JobRequest], Decision], decisions: int, warm: int,
        seed: int = 11) -> Figures:
    """CPU time per decision over ``decisions`` after ``warm`` untimed ones."""
    rng = random.Random(seed)
    t_placed = t_refused = t_step = 0.0
    n_placed = 0
    out: list[Decision] = []
    ids = list(mirror.vers)
    clock = time.process_time
    tick = timer_cost(clock)
    for k in range(warm + decisions):
        job = JobRequest(job_id=f"b{k}", demand=MIX[k % len(MIX)])
        t0 = clock()
        dec = decide(mirror, job)
        t1 = clock()
        if isinstance(dec, Placement):
            for s in dec.slots:
                mirror.apply(s, job.job_id, reservation_instance(s, job.job_id, 0, "t", False, True))
        # an exit somewhere (a random GPU's first busy instance), keeping the cluster about as full
        for _ in range(8):
            gid = ids[rng.randrange(len(ids))]
            busy = [i for i in mirror.get(gid).instances if i.job_id is not None]
            if busy:
                mirror.release(gid, busy[0].id, busy[0].job_id or "")
                break
        t2 = clock()
        if k >= warm:
            if isinstance(dec, Placement):
                t_placed += t1 - t0 - tick
                n_placed += 1
            else:
                t_refused += t1 - t0 - tick
            t_step += t2 - t0 - tick
            out.append(dec)
    us = 1e6
    return Figures(
        (t_placed + t_refused) / decisions * us, t_placed / max(n_placed, 1) * us,
        t_refused / max(decisions - n_placed, 1) * us, t_step / decisions * us, out,
    )


def best(rounds: list[Figures]) -> Figures:
    """Per figure, the lowest of the rounds: other work on the machine only ever adds time."""
    return Figures(
        min(r.decide_us for r in rounds), min(r.placed_us for r in rounds), min(r.refused_us for r in rounds),
        min(r.step_us for r in rounds), rounds[0].decisions,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1000])
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3, help="old and new alternate; the best round is shown")
    args = ap.parse_args()
    params = BalancerParams(top_k=3)
    print(f"CPU µs per decision (time.process_time, one clock read subtracted per interval; best of "
          f"{args.rounds} alternating rounds of {args.decisions} decisions)")
    print("| GPUs | path | all decisions | placed | could not place | step | placed/all |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        olds: list[Figures] = []
        news: list[Figures] = []
        for _ in range(args.rounds):
            olds.append(run(mirror_of(n), lambda m, j: place(m.view(), j, params), args.decisions, args.warm))
            news.append(run(mirror_of(n), lambda m, j: m.decide(j, params), args.decisions, args.warm))
            assert olds[-1].decisions == news[-1].decisions, "the two paths decided differently"
        old, new = best(olds), best(news)
        placed = sum(isinstance(d, Placement) for d in new.decisions)
        for name, f in (("place(mirror.view())", old), ("mirror.decide", new)):
            print(f"| {n:,} | {name} | {f.decide_us:.1f} | {f.placed_us:.1f} | {f.refused_us:.1f} | "
                  f"{f.step_us:.1f} | {placed}/{args.decisions} |")
        print(f"| {n:,} | old/new | {old.decide_us / new.decide_us:.2f}x | {old.placed_us / new.placed_us:.2f}x | "
              f"{old.refused_us / new.refused_us:.2f}x | {old.step_us / new.step_us:.2f}x | |")


if __name__ == "__main__":
    main()
