"""What the state store holds, as data: stored GPUs and instances, jobs, transition inputs and results.

The store keeps each GPU's instances as one JSON array in the GPU's hash (field ``inst``) so that a transition
is
one read-modify-write of one key inside one Lua script. ``StoredGpu.view()`` projects a stored GPU onto the
policies' ``GpuView``: instances in any state but ``idle`` occupy their slices (a ``retiring`` instance, being
destroyed, appears busy under the pseudo job ``RETIRING`` so no policy reuses or moves it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import msgspec

from shared.policy.reservation import Reservation as Hold
from shared.policy.shard_quota import QuotaLimit
from shared.policy.snapshot import GpuView, InstanceView

JobState = Literal[
    "pending", "placing", "running", "migrating", "finished", "failed", "cancelled", "rejected"
]
JOB_STATES: tuple[str, ...] = (
    "pending",
    "placing",
    "running",
    "migrating",
    "finished",
    "failed",
    "cancelled",
    "rejected",
)
ACTIVE_STATES = frozenset({"placing", "running", "migrating"})
TERMINAL_STATES = frozenset({"finished", "failed", "cancelled", "rejected"})
InstanceState = Literal["idle", "reserved", "busy", "retiring", "target"]
PLAIN_PROFILES = frozenset({"gpu", "shared"})
"""Instances of a non-MIG GPU: the whole GPU (``gpu``) or one time-sliced share (``shared``); never idle."""
RETIRING = "~retiring"
"""Pseudo job id under which a retiring (being destroyed) instance appears in a ``GpuView``."""

EXIT_TO_STATE: dict[str, str] = {
    "completed": "finished",
    "failed": "failed",
    "cancelled": "cancelled",
    "preempted": "pending",
    "lost": "pending",
}


class _Holds(msgspec.Struct, frozen=True):
    at: float
    holds: tuple[Hold, ...]


def encode_holds(holds: Sequence[Hold], now: float) -> bytes:
    return msgspec.json.encode(_Holds(at=now, holds=tuple(holds)))


def decode_holds(raw: object) -> tuple[float, list[Hold]]:
    if not isinstance(raw, bytes | str) or not raw:
        return 0.0, []
    h = msgspec.json.decode(raw, type=_Holds)
    return h.at, list(h.holds)


HISTORY_MAX = 64
"""Entries a job's history keeps (lua/prelude.lua ``hist_entry``, and the in-memory twin)."""


class StoredInstance(msgspec.Struct, kw_only=True, omit_defaults=True):
    id: str
    profile: str
    start: int
    size: int
    compute: int
    state: str = "idle"
    job: str | None = None
    prio: int = 0
    ls: bool = False
    mig: bool = True
    tenant: str = ""
    moved: float = 0.0
    started: float = 0.0
    created: bool = False
    """Created by the job's own reservation (a failed placement removes it; a reused one goes back to idle).
    """
    pre: bool = True
    """Its job may be preempted (its priority class is preemptible); only a running (busy) job ever is."""
    ends: float = 0.0
    """When its job is expected to end (decision time + duration hint); 0 = no hint. Time-aware placement
    (``shared.policy.placement.plugins.migsched``) reads it."""

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start

    def view(self) -> InstanceView:
        if self.state == "idle":
            return InstanceView(
                id=self.id, profile=self.profile, start=self.start, size=self.size, compute=self.compute
            )
        if self.state == "retiring":
            return InstanceView(
                id=self.id,
                profile=self.profile,
                start=self.start,
                size=self.size,
                compute=self.compute,
                job_id=RETIRING,
                migratable=False,
                latency_sensitive=True,
                preemptible=False,
            )
        return InstanceView(
            id=self.id,
            profile=self.profile,
            start=self.start,
            size=self.size,
            compute=self.compute,
            job_id=self.job,
            migratable=self.mig and self.state == "busy",
            latency_sensitive=self.ls,
            priority=self.prio,
            tenant=self.tenant,
            last_moved_at=self.moved if self.moved > 0 else -math.inf,
            started_at=self.started,
            preemptible=self.pre and self.state == "busy",
            ends_at=self.ends if self.ends > 0 else None,
        )


class StoredGpu(msgspec.Struct, kw_only=True):
    id: str
    node: str
    index: int
    model: str
    mig: bool = True
    healthy: bool = True
    ver: int = 0
    """Compare-and-set version: moves when capacity is claimed (see ``lua/prelude.lua``)."""
    rev: int = 0
    """Moves on every change."""
    pos: int = 0
    uuid: str = ""
    replicas: int = 0
    """Non-MIG GPUs only: time-sliced into this many shares (0: whole-GPU jobs only). Ignored in MIG mode."""
    instances: list[StoredInstance] = []

    def view(self) -> GpuView:
        return GpuView.build(
            id=self.id,
            node=self.node,
            index=self.index,
            model=self.model,
            mig=self.mig,
            healthy=self.healthy,
            replicas=0 if self.mig else self.replicas,
            instances=[i.view() for i in self.instances],
        )

    @property
    def busy_mask(self) -> int:
        m = 0
        for i in self.instances:
            if i.state != "idle":
                m |= i.mask
        return m


class JobRecord(msgspec.Struct, kw_only=True):
    job_id: str
    state: str
    reason: str = ""
    spec: bytes = b""
    """The job's ``JobSubmit`` JSON, kept so that a re-queued job can be re-decided without its publisher."""
    prio: int = 0
    at: float = 0.0
    gpu: str = ""
    inst: str = ""
    node: str = ""
    attempts: int = 0
    cancel: bool = False
    mig_gpu: str = ""
    mig_inst: str = ""
    updated: float = 0.0
    traceparent: str = ""
    """The W3C trace of the job's submit: a placement from the queue continues it."""
    preempted: int = 0
    """Times the job was preempted (re-queued for a higher-priority job or a quota reclaim)."""
    slots: tuple[tuple[str, str], ...] = ()
    """A gang (several whole GPUs): every (gpu id, instance id) it holds, the first being ``gpu``/``inst``.
    Empty for a single-slot job (then ``gpu``/``inst`` is its one slot)."""
    mig_gone: tuple[StoredInstance, ...] = ()
    """Memory store only (Redis: the job hash's ``mig_gone``): the idle instances a move's reserve removed from
    its target's way, given back when the move is aborted (``lua/migrate.lua``)."""
    tenant: str = ""
    """The tenant its last reservation was charged to ('' without tenancy)."""
    usage: dict[str, float] = {}
    """That reservation's quota charge."""
    counted: bool = False
    """``usage`` is counted in the shard's usage counters (from its reservation until it leaves the active
    states)."""

    def held(self) -> tuple[tuple[str, str], ...]:
        """Every (gpu id, instance id) the job's placement names (without a migration target)."""
        if self.slots:
            return self.slots
        return ((self.gpu, self.inst),) if self.gpu and self.inst else ()

    def nodes(self) -> frozenset[str]:
        """The nodes its placement and its migration target are on (a GPU id is ``<node>/<index>``)."""
        gpus = [g for g, _ in self.held()] + [g for g in (self.gpu, self.mig_gpu) if g]
        return frozenset({self.node} if self.node else set()) | {g.rpartition("/")[0] for g in gpus}


class HistoryEntry(msgspec.Struct, kw_only=True):
    at: float
    to: str
    reason: str = ""
    # "from" is a Python keyword: stored under that name, exposed as ``prev``
    prev: str = msgspec.field(default="", name="from")


class Eviction(msgspec.Struct, frozen=True, kw_only=True):
    """A preemption victim inside a ``reserve`` transition."""

    job_id: str
    instance_id: str
    reason: str


class SlotReservation(msgspec.Struct, frozen=True, kw_only=True):
    """One more slot of a gang reservation (``Reservation.extra``): the same fields as the first slot's."""

    gpu_id: str
    expected_ver: int
    instance: StoredInstance
    action: Literal["create", "reuse"] = "create"
    destroy: tuple[str, ...] = ()
    max_count: int = 8


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """Input of the ``reserve`` transition: put ``job_id`` on ``gpu_id`` if the GPU is still at
    ``expected_ver`` (and, for a gang, on every GPU of ``extra`` at its version: all or nothing).

    A slot is a MIG instance (create or reuse, on a GPU in MIG mode) or a plain one on a non-MIG GPU: profile
    ``gpu`` (the whole GPU, exclusive) or ``shared`` (time-slice replica ``start`` of ``replicas``)."""

    job_id: str
    gpu_id: str
    expected_ver: int
    instance: StoredInstance
    action: Literal["create", "reuse"]
    destroy: tuple[str, ...] = ()
    max_count: int = 8
    spec: bytes = b""
    prio: int = 0
    submitted_at: float = 0.0
    reason: str = ""
    traceparent: str = ""
    tenant: str = ""
    usage: dict[str, float] = {}
    """The quota charge of the placement, stored with the job so that its release uncharges exactly it; with a
    ``tenant``, added to the shard's usage counters, and taken off when the job leaves its instances."""
    limits: tuple[QuotaLimit, ...] = ()
    """The tenant's quota on the resources of ``usage``: over any, nothing is done (``quota``)."""
    victims: tuple[Eviction, ...] = ()
    """Running jobs preempted in the same transition: each must still run on the instance the decision saw;
    all its instances are vacated (MIG ones idled, then reused or destroyed per ``action``/``destroy``; plain
    ones removed) and the job re-queued with ``reason``."""
    extra: tuple[SlotReservation, ...] = ()
    """The other slots of a gang (``gpus: n`` on one node); the job record then lists all in ``slots``."""
    span: bool = False
    """The slots lie on several nodes (a gang across nodes); without it a reservation across nodes is refused
    (``node``). With ``track``, one place command per member node is recorded,
    ``place:<job>:<attempt>/<node rank>``."""
    track: bool = False
    """Also record the place command ``place:<job>:<attempt>`` in ``:cmds`` (node, job, GPU, ``at`` = ``now``)
    in the same transition: the balancer sends that command itself, so its time-out tracking costs no second
    Redis call."""

    def all_slots(self) -> tuple[SlotReservation, ...]:
        first = SlotReservation(
            gpu_id=self.gpu_id,
            expected_ver=self.expected_ver,
            instance=self.instance,
            action=self.action,
            destroy=self.destroy,
            max_count=self.max_count,
        )
        return (first, *self.extra)


class ReserveResult(msgspec.Struct, frozen=True, kw_only=True):
    """``status``: ok | conflict (version moved) | overlap | busy | gone | count | nogpu | unhealthy | mode (a
    MIG slot on a non-MIG GPU or a plain one on a MIG GPU) | node (a gang across nodes) | victim | quota (over one
    of ``limits``, the victims' charges given back first) | known (the
    job is already past pending: the submit is a replay and nothing was done). ``gpu_id``/``ver``: the first
    slot's; ``detail`` names the GPU that refused a gang."""

    status: str
    job_id: str
    gpu_id: str
    ver: int = 0
    detail: str = ""
    """ok: the job's placement attempts so far (names its ``sched.placed`` message); else what stood in the
    way."""
    master_addr: str = ""
    """ok, for a gang: the address the first slot's node declared at registration (its rendezvous host); ''
    if none, and for a one-slot job."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ReleaseResult(msgspec.Struct, frozen=True, kw_only=True):
    """``status``: ok (slices freed now) | noop (already released or never placed) | stale (the exit names
    another instance than the job's current one) | member (one node of a gang across nodes completed its part
    and others still run: its ``slots`` are freed, the job runs on). ``gpu``: the GPU right after the release
    (ok), or as it is now when an already released job's exit names its last instance (noop)."""

    status: str
    job_id: str
    state: str = ""
    gpu_id: str = ""
    node: str = ""
    instance_id: str = ""
    profile: str = ""
    gpu: StoredGpu | None = None
    slots: tuple[tuple[str, str], ...] = ()
    """A gang's every (gpu id, instance id), all freed by this release (empty for a single-slot job)."""
    stop: tuple[str, str, str] | None = None
    """(node, gpu id, instance id): the exit came from the source of a move to another node, whose target that
    node may run a copy of the job on; the target is kept retiring with the job until the node confirms a
    ``stop`` of that run (``node_stopped``), or drops it when its ``migrate_start`` failed."""
    stops: tuple[tuple[str, str, str], ...] = ()
    """(node, gpu id, instance id), one per other node of a gang across nodes that this exit ended: that node
    still runs its part, held ``retiring`` until it confirms a ``stop`` (``node_stopped``)."""
    given_back: str = ""
    """``gpu|id,id``: the idle instances the job's move had removed from its target's way, back in the state
    ``retiring`` (the move's ops that destroy them may not have run): the registry sends each a
    ``destroy_idle``."""


class PlacementFailure(NamedTuple):
    """What ``fail_placement`` did: ``status`` ok | noop, the job's ``state`` after it, the GPUs freed
    (comma-separated: a gang frees several), and the member stops of a gang across nodes whose parts started
    already ((node, gpu id, instance id) per node, held ``retiring`` until each confirms a ``stop``)."""

    status: str
    state: str
    gpus: str
    stops: tuple[tuple[str, str, str], ...] = ()


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.subject}: {self.detail}"


def gpu_id_of(node: str, index: int) -> str:
    return f"{node}/{index}"


def prio_score(prio: int, at: float) -> float:
    """Pending-queue order: higher priority first, then older first (lower score pops first)."""
    return (1000 - prio) * 1e10 + at
