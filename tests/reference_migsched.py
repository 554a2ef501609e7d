"""The ``migsched`` placement rule as a plain loop over GPUs and starts: the reference the vectorised policy
(``shared.policy.placement.plugins.migsched``) is checked against.
``choose`` returns the chosen (GPU id, start, action) or None; ``choose_gang`` the node a one-node gang of whole
MIG GPUs goes to, or None."""

from __future__ import annotations

import math

from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.placement.alignment import AlignParams, bucket
from shared.policy.placement.decision import JobRequest
from shared.policy.placement.long_gangs import waits
from shared.policy.placement.slots import count_ok
from shared.policy.request import resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView


def _end(gpu: GpuView, now: float) -> float:
    end = now
    for inst in gpu.instances:
        if inst.job_id is not None and inst.expected_end > end:
            end = inst.expected_end
    return end


def _ext(ends: float, until: float) -> float:
    if math.isinf(ends):
        return 0.0 if math.isinf(until) else math.inf
    return ends - until


def choose(snap: ClusterSnapshot, job: JobRequest, params: AlignParams) -> tuple[str, int, str] | None:
    now = job.now if job.now is not None else 0.0
    timed = params.in_time and job.duration_hint_s is not None and job.now is not None
    ends = now + job.duration_hint_s if timed and job.duration_hint_s is not None else math.inf
    node_end: dict[str, float] = {}
    node_empty: dict[str, int] = {}
    for p, g in enumerate(snap.gpus):
        node_end[g.node] = max(node_end.get(g.node, now), _end(g, now))
        if snap.ok[p] and not g.busy_mask:
            node_empty[g.node] = node_empty.get(g.node, 0) + 1
    usable = sum(1 for p in range(len(snap)) if snap.ok[p])
    comfortable = sum(node_empty.values()) > params.keep_empty * usable
    best: tuple[tuple[int, ...], int, str, int, str] | None = None
    for p, gpu in enumerate(snap.gpus):
        if not snap.ok[p]:
            continue
        model = snap.geometry.model(gpu.model)
        prof = resolve_profile(job.demand, model)
        if prof is None:
            continue
        tables = tables_for(model)
        before = tables.cost(gpu.busy_mask)
        g_ext = bucket(_ext(ends, _end(gpu, now)), params.minute_s)
        n_ext = bucket(_ext(ends, node_end[gpu.node]), params.minute_s)
        t1, t2 = (n_ext, g_ext) if params.node_first else (g_ext, n_ext)
        used = gpu.used_compute
        head = (used, 0) if comfortable else (0 if gpu.busy_mask else 1, used if params.spread else 0)
        options: list[tuple[int, int, int]] = []  # (action, start, destroyed)
        for inst in gpu.instances:
            if inst.job_id is None and inst.profile == prof.name:
                options.append((0, inst.start, 0))
        for s in prof.placements:
            pm = span(prof.memory_slices, s)
            if not gpu.busy_mask & pm and count_ok(gpu, prof, pm):
                options.append((1, s, (gpu.idle_mask & pm).bit_count()))
        for action, s, destroyed in options:
            after = tables.cost(gpu.busy_mask | span(prof.memory_slices, s))
            key = (*head, round((after - before) * params.fit_steps) + 64, t1, t2, action, round(after * 1000),
                   destroyed, min(node_empty.get(gpu.node, 0), 127), 15 - used, 15 - s)
            cand = (key, p, gpu.id, s, "reuse" if action == 0 else "create")
            if best is None or cand[:2] < best[:2]:
                best = cand
    return None if best is None else (best[2], best[3], best[4])


def choose_gang(snap: ClusterSnapshot, job: JobRequest, params: AlignParams) -> str | None:
    now = job.now if job.now is not None else 0.0
    timed = params.in_time and job.duration_hint_s is not None and job.now is not None
    ends = now + job.duration_hint_s if timed and job.duration_hint_s is not None else math.inf
    node_end: dict[str, float] = {}
    empty: dict[str, list[int]] = {}
    for p, g in enumerate(snap.gpus):
        node_end[g.node] = max(node_end.get(g.node, now), _end(g, now))
        if snap.ok[p] and not g.busy_mask:
            empty.setdefault(g.node, []).append(p)
    if waits(params, job.demand.gpus, job.duration_hint_s, job.waited_s(), sum(map(len, empty.values())),
             len(snap)) is not None:
        return None  # a long gang kept waiting for headroom (the rule of its own, tests/unit/test_long_gangs.py)
    fitting = [(bucket(_ext(ends, node_end[node]), params.minute_s), len(ps), ps[0], node)
               for node, ps in empty.items() if len(ps) >= job.demand.gpus]
    return min(fitting)[3] if fitting else None
