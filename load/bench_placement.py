"""Benchmark: one placement decision over 1,000 and 10,000 GPUs, vectorised balancer vs the per-GPU loop.

Not a test: it prints its figures as Markdown (``--out FILE`` writes them there too). The snapshot is built
once per size (as the services and the simulator keep it incrementally); only the policy call is timed.

    .venv/bin/python load/bench_placement.py            # both sizes
    .venv/bin/python load/bench_placement.py --sizes 1000 --repeat 50 --no-write
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared.mig.geometry import GpuModel, default_geometry  # noqa: E402
from shared.mig.occupancy import span  # noqa: E402
from shared.policy.fragcost import UNIFORM_SHAPES, frag_rate  # noqa: E402
from shared.policy.migration.planner import MigrationParams, plan_after_exit, plan_defrag  # noqa: E402
from shared.policy.placement.align_index import AlignIndex  # noqa: E402
from shared.policy.placement.alignment import AlignParams  # noqa: E402
from shared.policy.placement.balancer import BalancerParams, place_mig  # noqa: E402
from shared.policy.placement.decision import JobRequest  # noqa: E402
from shared.policy.placement.plugins.migsched import place_aligned  # noqa: E402
from shared.policy.request import Demand, mig, sized  # noqa: E402
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of  # noqa: E402
from tests.reference_balancer import place_mig_loop  # noqa: E402

MODELS = ("A100-40GB", "H100-80GB", "H200-141GB")
DEMANDS: dict[str, Demand] = {"1g": mig("1g"), "3g": mig("3g"), "2c/20GB": sized(2, 20)}


def layout(
    rng: random.Random, model: GpuModel, gid: str, fill: float, idle_share: float
) -> list[InstanceView]:
    """A random legal layout filling about ``fill`` of the memory slices; some instances idle."""
    opts = [(p, s) for p in model.scoring_profiles() if p.shape != "7g" for s in p.placements]
    rng.shuffle(opts)
    mask, counts = 0, Counter[str]()
    out: list[InstanceView] = []
    for p, s in opts:
        pm = span(p.memory_slices, s)
        if mask & pm or counts[p.name] >= p.max_count or (mask | pm).bit_count() > fill * model.memory_slices:
            continue
        mask |= pm
        counts[p.name] += 1
        busy = rng.random() >= idle_share
        out.append(InstanceView(id=f"{gid}/{len(out)}", profile=p.name, start=s, size=p.memory_slices,
                                compute=p.compute_slices, job_id=f"{gid}/j{len(out)}" if busy else None))
    return out


def cluster(n: int, seed: int = 7) -> ClusterSnapshot:
    rng = random.Random(seed)
    geo = default_geometry()
    gpus = []
    for i in range(n):
        model = geo.model(rng.choice(MODELS))
        gid = f"node{i // 8}/gpu{i % 8}"
        gpus.append(GpuView.build(id=gid, node=f"node{i // 8}", index=i % 8, model=model.name,
                                  instances=layout(rng, model, gid, rng.uniform(0.5, 0.7), 0.2)))
    return snapshot_of(geo, gpus)


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm the per-model tables
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


Row = tuple[int, str, float, float, float, float, float, bool]
Other = tuple[int, str, float, float]
migsched_rows: list[tuple[int, str, float, float, float, float]] = []
"""(GPUs, request, median µs, p99 µs, through the index: median µs, p99 µs) of the default policy, filled by
``measure``."""


def indexed(snap: ClusterSnapshot, job: JobRequest) -> Callable[[], object]:
    """One decision of the default policy as the balancer's mirror makes it (``AlignIndex.decide``, three
    runners-up), after the GPU the last decision chose changed: it is keyed again first, as after a placement."""
    index = AlignIndex(snap.geometry, snap.gpus, AlignParams())
    first = index.decide(job, "migsched")
    if first is None or first != place_aligned(snap, job):
        raise SystemExit(f"the index decided {first}, the policy {place_aligned(snap, job)}")
    position = {g.id: p for p, g in enumerate(snap.gpus)}
    last = [position[first.slot.gpu_id]]

    def call() -> object:
        index.update(snap.gpus[last[0]])
        dec = index.decide(job, "migsched")
        assert dec is not None
        last[0] = position[dec.slot.gpu_id]
        return dec

    return call


def measure(n: int, repeat: int, loop_repeat: int) -> tuple[list[Row], list[Other], float, float]:
    """Placement rows (vectorised vs loop) and the other core calls for one cluster size."""
    snap = cluster(n)
    busy = sum(g.busy_mask.bit_count() for g in snap.gpus) / (8 * n)
    idle = sum(1 for g in snap.gpus if g.idle_mask) / n
    params = BalancerParams()
    rows: list[Row] = []
    for label, demand in DEMANDS.items():
        job = JobRequest(job_id="bench", demand=demand)
        a, b = place_mig(snap, job, params), place_mig_loop(snap, job, params)
        same = getattr(a, "slots", None) == getattr(b, "slots", None)
        fast = timed(functools.partial(place_mig, snap, job, params), repeat)
        slow = timed(functools.partial(place_mig_loop, snap, job, params), loop_repeat)
        fm, sm = statistics.median(fast), statistics.median(slow)
        rows.append((n, label, fm, pct(fast, 0.99), sm, pct(slow, 0.99), sm / fm, same))
        print(f"{n:>6} GPUs {label:>8}: vectorised median {fm:8.1f} µs p99 {pct(fast, 0.99):8.1f} µs | "
              f"loop median {sm:9.1f} µs p99 {pct(slow, 0.99):9.1f} µs | ratio {sm / fm:6.1f}x | "
              f"same choice {same}")
        # the default policy, with a hint and a clock (its time keys on), against the same snapshot
        timed_job = JobRequest(job_id="bench", demand=demand, duration_hint_s=600.0, now=1e6)
        xs = timed(functools.partial(place_aligned, snap, timed_job), repeat)
        ys = timed(indexed(snap, timed_job), repeat)
        print(f"{n:>6} GPUs {label:>8}: migsched median {statistics.median(xs):8.1f} µs p99 {pct(xs, 0.99):8.1f} µs"
              f" | through its index median {statistics.median(ys):8.1f} µs p99 {pct(ys, 0.99):8.1f} µs")
        migsched_rows.append((n, label, statistics.median(xs), pct(xs, 0.99), statistics.median(ys), pct(ys, 0.99)))
    mp = MigrationParams()
    lazy = [g.id for g in snap.gpus if g.used_compute * 1000 < 400 * 7]
    target = lazy[len(lazy) // 2]
    calls: dict[str, Callable[[], object]] = {
        "frag_rate (uniform mix)": lambda: frag_rate(snap, UNIFORM_SHAPES),
        "plan_after_exit on a Lazy GPU": lambda: plan_after_exit(snap, target, 1e6, mp),
        "plan_defrag (max 4 moves)": lambda: plan_defrag(snap, 1e6, mp),
    }
    others: list[Other] = []
    for label, fn in calls.items():
        xs = timed(fn, max(5, repeat // 10))
        others.append((n, label, statistics.median(xs), pct(xs, 0.99)))
        print(f"{n:>6} GPUs {label}: median {others[-1][2]:9.1f} µs p99 {others[-1][3]:9.1f} µs")
    print(f"{n:>6} GPUs: {busy:.0%} of memory slices busy, {idle:.0%} of GPUs hold an idle instance")
    return rows, others, busy, idle


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--repeat", type=int, default=200, help="timed calls per size, demand and implementation")
    ap.add_argument("--loop-repeat", type=int, default=5, help="timed calls of the slow loop")
    ap.add_argument("--out", help="also write the Markdown to this file")
    args = ap.parse_args()
    rows: list[Row] = []
    others: list[Other] = []
    busy = idle = 0.0
    for n in args.sizes:
        r, o, busy, idle = measure(n, args.repeat, args.loop_repeat)
        rows += r
        others += o
    write(rows, others, busy, idle, args)


def write(rows: list[Row], others: list[Other], busy: float, idle: float, args: argparse.Namespace) -> None:
    cmd = "python load/bench_placement.py"
    if args.sizes != [1000, 10000]:
        cmd += " --sizes " + " ".join(map(str, args.sizes))
    if args.repeat != 200 or args.loop_repeat != 5:
        cmd += f" --repeat {args.repeat} --loop-repeat {args.loop_repeat}"
    lines = [
        "# Core placement benchmark",
        "",
        f"Command: `.venv/bin/{cmd}` ({args.repeat} vectorised / {args.loop_repeat} loop calls per row).",
        f"Machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores shared with other work (load average {os.getloadavg()[0]:.1f} at the end of "
        "the run): read the medians; p99s on a busy machine are mostly scheduling noise.",
        "",
        "One `place_mig` decision (policy only, snapshot already built) over a cluster of A100-40GB /",
        "H100-80GB / H200-141GB GPUs in random legal layouts 50-70 % full, ~20 % of instances idle. The",
        "baseline is `tests/reference_balancer.py`, the same algorithm as a per-GPU Python loop, measured",
        "in the same run; `same` says both picked the same GPU, placement and action. Budget:",
        "≤ 1 ms for 10,000 GPUs.",
        "",
        "| GPUs | request | vectorised median µs | p99 µs | loop median µs | p99 µs | loop/vect. | same |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for n, label, fm, fp, sm, sp, ratio, same in rows:
        lines.append(f"| {n:,} | {label} | {fm:.0f} | {fp:.0f} | {sm:.0f} | {sp:.0f} | {ratio:.0f}x | "
                     f"{same} |")
    lines += [
        "",
        f"Occupancy of the largest cluster: {busy:.0%} of memory slices busy, {idle:.0%} of GPUs hold an "
        "idle instance.",
        "",
        "Other core calls on the same clusters (no baseline; medians of repeated calls):",
        "",
        "| GPUs | call | median µs | p99 µs |",
        "|---:|---|---:|---:|",
    ]
    lines += [f"| {n:,} | {label} | {m:.0f} | {p:.0f} |" for n, label, m, p in others]
    lines += [
        "",
        "The default policy (`shared/policy/placement/plugins/migsched.py`, a 600-s hint and a clock, so its time",
        "keys are computed) on the same clusters, over the snapshot and through its incremental index as the",
        "balancer's mirror decides (`AlignIndex.decide`, the GPU chosen last keyed again before each call):",
        "",
        "| GPUs | request | median µs | p99 µs | index median µs | index p99 µs |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {n:,} | {label} | {m:.0f} | {p:.0f} | {im:.0f} | {ip:.0f} |"
              for n, label, m, p, im, ip in migsched_rows]
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
