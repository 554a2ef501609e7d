"""The cluster as ``migsched status`` (and ``up --demo``) shows it, read from the state store in a few round
trips.

``read`` returns plain data (``ClusterView``: every GPU's instances, load and FragCost, every job's state),
which ``--json`` prints as is; ``render`` draws it for people: one row of memory slices per GPU (who holds
each slice), then the jobs by state.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec
from rich.console import Group
from rich.table import Table
from rich.text import Text

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.occupancy import draw
from shared.policy.fragcost import frag_cost
from shared.policy.placement.sharing import WHOLE_PROFILE
from shared.policy.request import Demand, full_profile
from shared.policy.reservation import Reservation
from shared.state import JOB_STATES, JobRecord, RedisState, StoredGpu, StoredInstance
from shared.state.codec import decode_labels


class InstanceRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    profile: str
    start: int
    size: int
    compute: int
    state: str
    """idle | reserved | busy | retiring | target"""
    job_id: str | None = None


class GpuRow(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    node: str
    index: int
    model: str
    healthy: bool
    load: float
    """Used compute slices / the model's compute slices."""
    frag_cost: float
    """FragCost of the busy slices (idle instances are reclaimable)."""
    instances: tuple[InstanceRow, ...]
    slices: str
    """The memory slices drawn as one text row (``shared.mig.occupancy.draw``); one box for a GPU not in MIG
    mode."""
    mig: bool = True
    """False: not in MIG mode, running one whole-GPU job or time-sliced shares."""
    replicas: int = 0
    """Not in MIG mode: the time-sliced shares it offers (0: whole-GPU jobs)."""


class JobRow(msgspec.Struct, frozen=True, kw_only=True):
    """What the jobs table shows of one job besides its state and reason."""

    tenant: str = ""
    demand: str = ""
    since: float = 0.0
    """When it was submitted (its age is ``ClusterView.at`` minus this)."""


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    namespace: str
    nodes: dict[str, str]
    """node -> up | lost"""
    gpus: tuple[GpuRow, ...]
    jobs: dict[str, str]
    """job id -> state"""
    counts: dict[str, int]
    """state -> number of jobs"""
    reasons: dict[str, str] = {}
    """pending job id -> why it waits (quota | capacity | reserved capacity | preempted by ...: detail)"""
    holds: tuple[Reservation, ...] = ()
    """GPUs the balancer holds for large waiting jobs, as its last backfill pass planned them."""
    rows: dict[str, JobRow] = {}
    """job id -> its tenant, demand and submit time"""
    blocks: dict[str, str] = {}
    """node -> its topology block (``MIGSCHED_NODE_LABELS``), for the nodes that declared one"""

    @property
    def busy_slices(self) -> int:
        return sum(i.size for g in self.gpus for i in g.instances if i.state != "idle")

    @property
    def total_slices(self) -> int:
        return sum(8 if g.model != "A30-24GB" else 4 for g in self.gpus)


def gpu_row(g: StoredGpu, geometry: Geometry) -> GpuRow:
    model = geometry.model(g.model)
    busy = [i for i in g.instances if i.state != "idle"]
    if g.mig:
        load = sum(i.compute for i in busy) / model.compute_slices
        labels = [(i.job or "?") if i.state != "idle" else f"idle {i.profile}" for i in g.instances]
        slices = draw(model, [(i.profile, i.start) for i in g.instances], labels)
    else:
        load, slices = _plain(g, model, busy)
    return GpuRow(
        id=g.id,
        node=g.node,
        index=g.index,
        model=g.model,
        healthy=g.healthy,
        load=round(load, 4),
        frag_cost=round(frag_cost(model, g.busy_mask), 4),
        instances=tuple(
            InstanceRow(
                id=i.id,
                profile=i.profile,
                start=i.start,
                size=i.size,
                compute=i.compute,
                state=i.state,
                job_id=i.job,
            )
            for i in g.instances
        ),
        slices=slices,
        mig=g.mig,
        replicas=0 if g.mig else g.replicas,
    )


def _plain(g: StoredGpu, model: GpuModel, busy: list[StoredInstance]) -> tuple[float, str]:
    """The load and the drawing of a GPU not in MIG mode: it has no slices, so one box over its memory says who
    holds it, a whole-GPU job or its time-sliced shares."""
    whole = [i.job or "?" for i in busy if i.profile == WHOLE_PROFILE]  # a time-sliced GPU may run one too
    shares = [i.job or "?" for i in busy if i.profile != WHOLE_PROFILE]
    if whole:
        load, label = 1.0, whole[0]
    elif g.replicas:
        load, label = len(shares) / g.replicas, f"{', '.join(shares) or 'free'} ({len(shares)}/{g.replicas} shares)"
    else:
        load, label = 0.0, "free (not MIG)"
    return load, draw(model, [(full_profile(model).name, 0)], [label])


async def read(state: RedisState, geometry: Geometry) -> ClusterView:
    at = time.time()
    gpus = await state.load_gpus()
    ids = [j for s in range(state.shards) for j in await state.all_job_ids(s)]
    recs = [r for r in await state.jobs(ids) if r is not None]
    jobs = {r.job_id: r.state for r in recs}
    rows = {r.job_id: job_row(r) for r in recs}
    reasons = {r.job_id: r.reason for r in recs if r.state == "pending"}
    records = await state.nodes()
    nodes = {n: h.get("state", "?") for n, h in records.items()}
    blocks = {n: b for n, h in records.items() if (b := decode_labels(h.get("labels", "")).get("block"))}
    counts = Counter(jobs.values())
    holds = await all_holds(state)
    for h in holds:  # a held job waits for its GPUs to drain: say so beside its last reason
        if h.job_id in reasons:
            reasons[h.job_id] = f"reserved: {h.explain(at)}; " + reasons[h.job_id]
    return ClusterView(
        at=at,
        namespace=state.namespace,
        nodes=nodes,
        gpus=tuple(gpu_row(g, geometry) for g in sorted(gpus, key=lambda g: (g.node, g.index))),
        jobs=jobs,
        counts={s: counts.get(s, 0) for s in JOB_STATES},
        reasons=reasons,
        holds=tuple(holds),
        rows=rows,
        blocks=blocks,
    )


async def all_holds(state: RedisState) -> list[Reservation]:
    """The reservations of every shard, as the balancer's last backfill pass of each planned them."""
    holds: list[Reservation] = []
    for shard in range(state.shards):
        holds += (await state.holds(shard))[1]
    return holds


class _Spec(msgspec.Struct):
    """The fields of a stored ``JobSubmit`` the table shows (decoded without the rest)."""

    tenant: str = ""
    submitted_at: float = 0.0
    demand: Demand = msgspec.field(default_factory=Demand)


def job_row(rec: JobRecord) -> JobRow:
    try:
        spec = msgspec.json.decode(rec.spec, type=_Spec) if rec.spec else _Spec()
    except msgspec.DecodeError:
        spec = _Spec()
    return JobRow(tenant=spec.tenant, demand=spec.demand.label() if rec.spec else "",
                  since=spec.submitted_at or rec.at)


_STYLE = {
    "pending": "yellow",
    "placing": "cyan",
    "running": "green",
    "migrating": "magenta",
    "finished": "blue",
    "failed": "red",
    "cancelled": "dim",
    "rejected": "red",
}


def compact_slices(g: GpuRow, per_slice: int = 4) -> Text:
    """The slices of one GPU in ``per_slice`` characters each: busy instances green with their shape, idle
    ones dim, free slices a dot (the ``up --demo`` view, where 16 GPUs must fit an 80-column terminal)."""
    slices = 8 if g.model != "A30-24GB" else 4
    if not g.mig:
        return _compact_plain(g, slices * per_slice - 2)
    owner: dict[int, InstanceRow] = {}
    for inst in g.instances:
        for k in range(inst.start, inst.start + inst.size):
            owner[k] = inst
    out = Text()
    k = 0
    while k < slices:
        held = owner.get(k)
        if held is None:
            out.append("[" + ".".center(per_slice - 2) + "]", style="dim")
            k += 1
            continue
        width = held.size * per_slice - 2
        busy = held.state != "idle"
        label = held.profile.split(".")[0] if busy else "idle"
        out.append("[" + label[:width].center(width) + "]", style="bold green" if busy else "yellow")
        k += held.size
    return out


def _compact_plain(g: GpuRow, width: int) -> Text:
    """A GPU not in MIG mode has no slices: one box, its whole-GPU job's or its shares'."""
    busy = [i for i in g.instances if i.state != "idle"]
    used = len(busy)
    whole = any(i.profile == WHOLE_PROFILE for i in busy)
    label = "gpu" if whole else f"{used}/{g.replicas} shares" if g.replicas else "free"
    return Text("[" + label[:width].center(width) + "]", style="bold green" if used else "dim")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h" if seconds < 172800 else f"{seconds / 86400:.1f}d"


def render(
    view: ClusterView,
    *,
    show_jobs: int = 20,
    title: str = "migsched cluster",
    compact: bool | None = None,
    width: int = 120,
    tenants: Sequence[str] = (),
    states: Sequence[str] = (),
    machines: Table | None = None,
) -> Group:
    """For a terminal ``width`` columns wide: below 120 the slices are drawn compactly; long names and reasons
    wrap rather than being cut. ``tenants``/``states`` filter the jobs table (default: the active states).
    ``machines``: the table of the cluster's machines to show instead of one row per GPU (``nodeview``)."""
    compact = width < 120 if compact is None else compact
    parts: list[object] = [machines if machines is not None else gpu_table(view, title, compact)]
    counts = "  ".join(f"[{_STYLE.get(s, '')}]{s} {n}[/]" for s, n in view.counts.items())
    if view.blocks:
        parts.append(Text(f"blocks: {blocks_line(view.blocks)}"))
    parts.append(Text.from_markup(f"jobs: {counts}"))
    wanted = set(states) or {"pending", "placing", "running", "migrating"}
    listed = [(j, s) for j, s in view.jobs.items()
              if s in wanted and (not tenants or view.rows.get(j, JobRow()).tenant in tenants)]
    if show_jobs and listed:
        t = Table(title=f"jobs ({len(listed)}; first {min(show_jobs, len(listed))})", title_justify="left")
        t.add_column("job", overflow="fold")
        t.add_column("state", no_wrap=True)
        t.add_column("tenant", overflow="fold")
        t.add_column("demand", overflow="fold")
        t.add_column("age", justify="right", no_wrap=True)
        t.add_column("why it waits", overflow="fold", ratio=1)
        order = {s: k for k, s in enumerate(JOB_STATES)}
        for j, s in sorted(listed, key=lambda x: (order.get(x[1], 99), x[0]))[:show_jobs]:
            row = view.rows.get(j, JobRow())
            age = _age(max(0.0, view.at - row.since)) if row.since else ""
            t.add_row(j, Text(s, style=_STYLE.get(s, "")), row.tenant, row.demand, age, view.reasons.get(j, ""))
        parts.append(t)
    if view.holds:
        t = Table(title=f"reservations ({len(view.holds)})", title_justify="left")
        t.add_column("job", overflow="fold")
        t.add_column("held GPUs", overflow="fold")
        t.add_column("expected start", no_wrap=True)
        t.add_column("why", overflow="fold")
        for h in view.holds:
            left = h.start - view.at
            t.add_row(h.job_id, held_gpus(h.gpus), f"in {left:.0f} s" if left >= 0.5 else "now", h.reason)
        parts.append(t)
    return Group(*parts)  # type: ignore[arg-type]


def gpu_table(view: ClusterView, title: str, compact: bool) -> Table:
    gpus = Table(title=f"{title} — {len(view.gpus)} GPUs on {len(view.nodes)} nodes", expand=False,
                 title_justify="left")
    gpus.add_column("GPU", overflow="fold")
    gpus.add_column("memory slices 0..7: who holds them", no_wrap=compact, overflow="fold")
    gpus.add_column("load", justify="right", no_wrap=True)
    gpus.add_column("Frag", justify="right", no_wrap=True)
    for g in view.gpus:
        name = f"{g.id} {g.model}" + ("" if g.healthy else " (unhealthy)")
        if view.nodes.get(g.node) == "lost":
            name += " (node lost)"
        slices = compact_slices(g) if compact else Text(g.slices, style="green" if g.load else "dim")
        gpus.add_row(name, slices, f"{g.load:.2f}", f"{g.frag_cost:.2f}")
    return gpus


def blocks_line(blocks: Mapping[str, str]) -> str:
    """Each topology block with its nodes: ``b0 (n1, n2); b1 (n3)``."""
    by_block: dict[str, list[str]] = {}
    for node, block in sorted(blocks.items()):
        by_block.setdefault(block, []).append(node)
    return "; ".join(f"{b} ({', '.join(ns)})" for b, ns in sorted(by_block.items()))


def held_gpus(gpus: Sequence[str]) -> str:
    """GPU ids (``node/index``) grouped by node with runs of indices, e.g. ``n1/0-7, n2/0-3,6``: a hold for a
    gang of 128 GPUs stays a line or two. An id of another form is listed as it is."""
    by_node: dict[str, list[int]] = {}
    other: list[str] = []
    for g in gpus:
        node, _, index = g.rpartition("/")
        if node and index.isdigit():
            by_node.setdefault(node, []).append(int(index))
        else:
            other.append(g)
    parts = [f"{node}/{_runs(sorted(ix))}" for node, ix in by_node.items()]
    return ", ".join(parts + other)


def _runs(ix: list[int]) -> str:
    """Sorted indices as runs: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out: list[str] = []
    start = prev = ix[0]
    for i in [*ix[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def summary(view: ClusterView) -> str:
    c = view.counts
    return f"{view.busy_slices}/{view.total_slices} memory slices busy; " + ", ".join(
        f"{s} {c.get(s, 0)}" for s in JOB_STATES if c.get(s, 0)
    )


def as_json(view: ClusterView) -> bytes:
    return msgspec.json.format(msgspec.json.encode(view), indent=2)


def job_states(view: ClusterView, states: Sequence[str]) -> list[str]:
    return sorted(j for j, s in view.jobs.items() if s in states)
