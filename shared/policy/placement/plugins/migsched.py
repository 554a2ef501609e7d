"""``migsched``, the default policy: pack in space, align in time, hold GPUs for large waiting jobs.

Measured on the openb traces, nearly every rejection is a job that needs whole GPUs (``7g``, or several GPUs on
one node) and waits out its patience because every GPU holds some small job, or every node some long one.
Small profiles are never what is rejected. So the rule keeps whole GPUs free, and makes busy ones free up
together. For a MIG request, over every healthy MIG GPU and every legal start (lower is better):

1. While more than ``keep_empty`` of the usable GPUs are empty, the least loaded GPU (less interference,
   empty ones included). Otherwise: **do not open an empty GPU** for a job that fits beside others (a
   full-size profile always needs one); with ``spread``, then the least loaded of the busy GPUs.
2. The FragCost increase of the GPU, in steps of ``1 / fit_steps`` (how well the instance fits the hole).
3. **Extend no busy period**: the job's expected end (``now + duration_hint_s``) against the GPU's and the
   node's expected free time (the latest ``ends_at`` of their busy instances), each on a log scale of
   minutes (``bucket``). A short job goes where the running jobs outlast it, a long one where long ones
   already are, so GPUs and nodes whose jobs all end soon stay that way and drain for reservations and
   gangs. Without a hint or a clock every extension is equal.
4. Reuse an idle instance of the exact profile before creating one (no reconfiguration).
5. FragCost after the placement, then fewest idle slices destroyed.
6. The node with the fewest empty GPUs, the fullest GPU, the highest start, the first GPU in snapshot order.

All keys pack into one int64 per (GPU, start) so that a decision is a few vector operations and one argmin
over the snapshot's columns (``ClusterSnapshot.ends``, ``node_end`` and ``node_empty`` included; the time fields
for the best class only, ``shared.policy.placement.alignment``); ``tests/reference_migsched.py`` is the same
rule as a plain loop. ``gpus: n`` takes the node with ``n`` empty GPUs whose busy period it
extends least, then the node with the fewest empty GPUs (best fit), once plain GPUs are out; a *long* gang (a
large share of the cluster for hours) waits for headroom first (``shared.policy.placement.long_gangs``);
time-sliced shares go the way every policy shares (``shared.policy.placement.rules``). The queue side (reservations) is
``shared.policy.reservation``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.placement.alignment import (
    SHIFT,
    UNFIT,
    AlignParams,
    Context,
    Group,
    bucket,
    buckets,
    exact_keys,
    extension,
    full_key,
    group,
    static_of,
    unpack,
    widen,
)
from shared.policy.placement.decision import Candidate, CannotPlace, Decision, JobRequest, Placement, Slot
from shared.policy.placement.explain import whole_placement
from shared.policy.placement.gang import member_slots
from shared.policy.placement.long_gangs import waits
from shared.policy.placement.registry import PolicySpec, Rules, register
from shared.policy.placement.rules import compose
from shared.policy.placement.sharing import no_node_has
from shared.policy.placement.slots import UnknownPolicyError, count_ok, create_slot, reuse_slot
from shared.policy.request import resolve_profile
from shared.policy.snapshot import ClusterSnapshot, GpuView

NAME = "migsched"
__all__ = ["NAME", "AlignParams", "bucket", "buckets", "place_aligned"]


def rules(params: AlignParams, policy: str = NAME) -> Rules:
    """The rule's MIG and gang parts (see the module docstring)."""

    def mig(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if len(snap) == 0:
            return CannotPlace(job_id=job.job_id, policy=policy, reasons=("no GPU in the cluster",))
        return _mig(snap, job, Context.of_snapshot(snap, job, params), params, policy)

    def gang(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        return _gang(snap, job, Context.of_snapshot(snap, job, params), params, policy)

    return Rules(mig=mig, gang=gang, align_params=params)


def place_aligned(
    snap: ClusterSnapshot, job: JobRequest, policy: str = NAME, params: AlignParams | None = None
) -> Decision:
    """One decision for one job, the policy as the registry composes it."""
    return compose(policy, rules(params or AlignParams(), policy))(snap, job)


def _mig(snap: ClusterSnapshot, job: JobRequest, ctx: Context, params: AlignParams, policy: str) -> Decision:
    groups: list[Group] = []
    missing: Counter[str] = Counter()
    for k, model in enumerate(snap.model_list):
        prof = resolve_profile(job.demand, model)
        if prof is None:
            missing[f"{model.name} has no profile for {job.demand.label()}"] += int(
                (np.asarray(snap.model_idx) == k).sum())
            continue
        groups.append(group(snap, ctx, params, k, model, prof))
    got, at_max = choose(groups, ctx, params, snap.gpus)
    if got is None:
        return _cannot(snap, job, groups, missing, at_max, policy)
    return explain(snap.gpus, job, policy, got, groups, ctx, params)


def choose(groups: Sequence[Group], ctx: Context, params: AlignParams, gpus: Sequence[GpuView],
           ) -> tuple[tuple[int, Group, GpuView] | None, int]:
    """The smallest (key, position) over every group's GPUs (``gpus``: the views by position) whose candidate is
    legal once max counts are checked, as (key, its group, its GPU), or None; and how many GPUs' best candidate
    was at its max count. The one choice of the rule: the policy over a snapshot's groups, the simulator's
    ``AlignIndex`` over its own."""
    at_max = 0
    while True:
        best: tuple[int, int, Group, int] | None = None
        for g in groups:
            if not g.keys.size:
                continue
            row = int(np.argmin(g.keys))
            key = int(g.keys[row])
            if key != UNFIT and (best is None or (key, int(g.pos[row])) < best[:2]):
                best = (key, int(g.pos[row]), g, row)
        if best is None:
            return None, at_max
        key, p, g, row = best
        gpu = gpus[p]
        if not legal(gpu, g.prof, key):
            at_max += 1  # at its max count once the idle instances in the way go (+me profiles): its next best
            exact_keys(ctx, params, g)  # which may rank it past its class
            g.keys[row] = _next_best(ctx, params, g, row, gpu)
            continue
        return (key, g, gpu), at_max


def slot_of(gpu: GpuView, g: Group, key: int) -> Slot:
    """The slot a chosen key names on ``gpu``."""
    return slot_at(gpu, g.model, g.prof, key)


def slot_at(gpu: GpuView, model: GpuModel, prof: Profile, key: int) -> Slot:
    """The slot a key for ``prof`` on ``gpu`` (of ``model``) names."""
    start = 15 - ((key >> SHIFT["start"]) & 0xF)
    if (key >> SHIFT["action"]) & 1:
        return create_slot(gpu, model, prof, start)
    return reuse_slot(gpu, model, _idle_id(gpu, prof, start))


def legal(gpu: GpuView, prof: Profile, key: int) -> bool:
    """Whether the candidate a key names is legal once max counts are checked (a reuse always is)."""
    start = 15 - ((key >> SHIFT["start"]) & 0xF)
    return not (key >> SHIFT["action"]) & 1 or count_ok(gpu, prof, span(prof.memory_slices, start))


def _next_best(ctx: Context, params: AlignParams, g: Group, row: int, gpu: GpuView) -> int:
    """The GPU's best key over the candidates still legal once max counts are checked (UNFIT: none)."""
    prof, by_busy = g.prof, not ctx.comfortable
    options = [static_of(gpu.busy_mask, gpu.idle_mask, g.model, prof, params.fit_steps, i.start, 0, by_busy)
               for i in gpu.instances if i.job_id is None and i.profile == prof.name]
    for s in prof.placements:
        pm = span(prof.memory_slices, s)
        if not gpu.busy_mask & pm and count_ok(gpu, prof, pm):
            options.append(static_of(gpu.busy_mask, gpu.idle_mask, g.model, prof, params.fit_steps, s, 1, by_busy))
    if not options:
        return int(UNFIT)
    return full_key(ctx, params, int(g.pos[row]), gpu.used_compute, min(options))


def _idle_id(gpu: GpuView, prof: Profile, start: int) -> str:
    return next(i.id for i in gpu.instances if i.job_id is None and i.profile == prof.name and i.start == start)


def _describe(b: int) -> str:
    if b == 0:
        return "nothing"
    if b >= 64:
        return "an unknown time"
    return f"{60 * (2 ** (b - 1) - 1):.0f}-{60 * (2 ** b - 1):.0f} s"


def explain(gpus: Sequence[GpuView], job: JobRequest, policy: str, got: tuple[int, Group, GpuView],
            groups: Sequence[Group], ctx: Context, params: AlignParams) -> Placement:
    """The chosen candidate (``choose``'s answer) as a ``Placement`` with its reasons, score and runners-up
    (``gpus``: the views by position): the policy's over a snapshot, the balancer mirror's ``AlignIndex``'s over
    its own groups."""
    key, g, gpu = got
    slot = slot_of(gpu, g, key)
    f = unpack(key)
    tables = tables_for(g.model)
    after = gpu.busy_mask | span(slot.size, slot.start)
    where = "opens an empty GPU" if not gpu.busy_mask else f"beside running jobs ({gpu.used_compute} slices busy)"
    reasons = [
        f"{policy}: {where}; FragCost {tables.cost(gpu.busy_mask):.3f} -> {tables.cost(after):.3f}",
        f"extends the GPU's busy time by {_describe(f['t1'])} and the node's by {_describe(f['t2'])}",
        f"reuses idle instance {slot.instance_id}" if slot.action == "reuse" else "creates an instance",
        f"score {key}",
    ]
    if slot.destroy:
        reasons.append(f"destroys {len(slot.destroy)} idle instance(s) in the way")
    return Placement(
        job_id=job.job_id, policy=policy, slots=(slot,), tier="any", frag_before=tables.cost(gpu.busy_mask),
        frag_after=tables.cost(after), reasons=tuple(reasons), candidates=_runners_up(gpus, groups, slot, ctx, params),
    )


def _runners_up(gpus: Sequence[GpuView], groups: Sequence[Group], chosen: Slot, ctx: Context, params: AlignParams,
                ) -> tuple[Candidate, ...]:
    """The ``top_k`` best candidates on other GPUs, by (key, position): every GPU tied at the cut is ranked, so
    the list depends on the keys alone, not on how a group's rows are laid out."""
    top_k = params.top_k
    if top_k <= 0:
        return ()
    ranked: list[tuple[int, int, Group]] = []
    for g in groups:
        widen(ctx, params, g, top_k + 1)  # the best class may be too small to hold the group's runners-up
        n = min(top_k + 1, g.keys.size)
        if not n:
            continue
        rows = np.flatnonzero(g.keys <= np.partition(g.keys, n - 1)[n - 1])
        for row in rows[np.lexsort((g.pos[rows], g.keys[rows]))[:n]].tolist():
            if int(g.keys[row]) != UNFIT:
                ranked.append((int(g.keys[row]), int(g.pos[row]), g))
    ranked.sort(key=lambda c: c[:2])
    out: list[Candidate] = []
    for key, p, g in ranked:
        gpu = gpus[p]
        if gpu.id == chosen.gpu_id:
            continue
        f = unpack(key)
        start = 15 - f["start"]
        tables = tables_for(g.model)
        pm = span(g.prof.memory_slices, start)
        out.append(Candidate(
            gpu_id=gpu.id, profile=g.prof.name, start=start, action="reuse" if f["action"] == 0 else "create",
            tier="any", frag_before=tables.cost(gpu.busy_mask), frag_after=tables.cost(gpu.busy_mask | pm),
            load=gpu.used_compute / max(1, g.model.compute_slices), idle_slices_destroyed=f["destroyed"],
        ))
        if len(out) >= top_k:
            break
    return tuple(out)


def _cannot(snap: ClusterSnapshot, job: JobRequest, groups: Sequence[Group], missing: Counter[str], at_max: int,
            policy: str) -> CannotPlace:
    counts = Counter(missing)
    counts["not in MIG mode or unhealthy"] = int((~snap.ok).sum())
    for g in groups:
        counts[f"no free {g.prof.name} placement"] += int((g.keys == UNFIT).sum())
    if at_max:
        counts[f"{job.demand.label()} at its max count"] = at_max
    counts = Counter({k: v for k, v in counts.items() if v})
    reasons = tuple(f"{n} GPU(s): {why}" for why, n in counts.most_common()) or ("no GPU in the cluster",)
    return CannotPlace(job_id=job.job_id, policy=policy, reasons=reasons, counts=dict(counts))


def _gang(snap: ClusterSnapshot, job: JobRequest, ctx: Context, params: AlignParams, policy: str) -> Decision:
    n = job.demand.gpus
    empty = np.flatnonzero(snap.ok & (np.asarray(snap.busy) == 0))
    why = waits(params, n, job.duration_hint_s, job.waited_s(), empty.size, len(snap))
    if why is not None:
        return CannotPlace(job_id=job.job_id, policy=policy, reasons=(why,), deferred=True)
    count = np.asarray(snap.node_empty)[empty]  # per empty GPU: its node's empty GPUs (the same ones)
    room = empty[count >= n]
    if not room.size:
        return CannotPlace(job_id=job.job_id, policy=policy, reasons=(
            no_node_has(n, "empty", int(count.max()) if count.size else 0, mig=True),))
    node = np.asarray(snap.node_idx)
    _, first = np.unique(node[room], return_index=True)  # each such node's first empty GPU
    head = gang_head(ctx, room[first])
    members = room[node[room] == node[head]].tolist()
    slots = member_slots(snap.geometry, [snap.gpus[p] for p in members], n)
    return whole_placement(job, slots, policy)


def gang_head(ctx: Context, heads: npt.NDArray[np.intp]) -> int:
    """Of the nodes that hold a gang (each by its first empty GPU, ``heads``), the one whose busy period the
    gang extends least, then the one with the fewest empty GPUs (best fit), then the first: its first empty
    GPU. The gang rule's one choice: the policy over a snapshot, the simulator's ``AlignIndex`` over its own."""
    ext = ctx.edges.searchsorted(extension(ctx.ends, ctx.node_end(heads)), side="right")
    return int(heads[np.lexsort((heads, ctx.node_empty[heads], ext))[0]])


@register(PolicySpec(name=NAME, description="the default: pack in space, align in time (keep empty GPUs, least "
                     "extension of the GPU's and node's busy time, then FragCost), with reservations for large "
                     "waiting jobs", reserves=True),
          accepts=("keep_empty", "spread", "fit_steps", "in_time", "node_first", "top_k", "minute_s", "gang_hours",
                   "gang_room", "gang_wait_s"))
def _build(spec: PolicySpec, params: dict[str, Any]) -> tuple[PolicySpec, Rules]:
    try:  # the constructor checks neither types nor bounds: a typo must not run as a silent variant
        checked = msgspec.convert(params, AlignParams)
    except msgspec.ValidationError as exc:
        raise UnknownPolicyError(f"policy {spec.name!r}: {exc}") from exc
    return spec, rules(checked, spec.name)
