"""What one simulation run holds, as its event handlers see it.

``Simulator`` (``engine``) is the run; the handlers beside it (``backfill``, ``reserving``, ``moves``,
``release``, ``invariants``, ``metrics``) read and change a run through this protocol, so they depend on what a run
is, not on the engine that drives it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from shared.policy.migration.unblock import UnblockParams
from shared.policy.placement.align_index import AlignIndex
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.decision import Decision, JobRequest, Slot
from shared.policy.placement.index import PlacementIndex
from shared.policy.reservation import Reservation, ReservationParams
from shared.policy.retention import RecentDemand
from shared.policy.snapshot import ClusterSnapshot, InstanceView
from shared.sim import events as ev
from shared.sim.cluster import SimCluster
from shared.sim.config import SimConfig
from shared.sim.jobs import SimJob, Workload

Policy = Callable[[ClusterSnapshot, JobRequest], Decision]


class Spec(Protocol):
    """What a run reads of a policy spec (``shared.policy.placement.registry.PolicySpec`` has these)."""

    @property
    def name(self) -> str: ...
    @property
    def repartitions(self) -> bool: ...
    @property
    def initial_layout(self) -> str | None: ...
    @property
    def migrates(self) -> bool: ...


class SimRun(Protocol):
    # the run's inputs
    workload: Workload
    spec: Spec
    policy: Policy
    cfg: SimConfig
    cluster: SimCluster
    jobs: tuple[SimJob, ...]
    index: dict[str, int]
    layouts: dict[str, tuple[tuple[str, int], ...]]
    largest_node: int

    # time, events and outcomes
    now: float
    q: ev.EventQueue
    events: int
    out: Any  # metrics.Outcome
    demand: RecentDemand

    # per job: state, remaining work, speed, instances, moves in flight
    state: list[int]
    work: list[float]
    speed: list[float]
    insts: list[tuple[str, ...]]
    moving: list[Any]  # moves.InFlight | None
    chain: dict[int, list[Any]]

    # the queue, and what the scheduling pass remembers between passes
    queue: list[tuple[int, float, int]]
    freed: list[str]
    failed: dict[tuple[str, int], int]
    memo_keys: list[tuple[str, int]]
    blocks: tuple[tuple[str, tuple[str, ...]], ...]
    profiles: dict[tuple[str, str], tuple[int, ...]]
    placer: PlacementIndex | AlignIndex | None
    align: AlignParams | None
    long_gangs: frozenset[int]

    # reservations and unblocking moves
    reservation_params: ReservationParams
    reservations: list[Reservation]
    pinned: dict[int, Reservation]
    unblocks: bool
    unblock_params: UnblockParams
    held_free: float
    held_since: float
    reserved_idle_s: float

    # migration
    mig: Any  # the shared.policy.migration.planner module, when the policy migrates
    mig_params: Any
    last_move_at: float
    moves_started: int
    moves_skipped: int
    defrag_memo: tuple[int, float] | None

    def hint(self, i: int) -> float | None: ...
    @property
    def version(self) -> int: ...
    def start(self, i: int, slots: tuple[Slot, ...]) -> None: ...
    def template(self, i: int) -> InstanceView: ...
    def ops_ready(self, gpu_id: str, ops: int) -> float: ...
    def advance(self, i: int) -> None: ...
    def join(self, i: int, iid: str) -> None: ...
    def leave(self, i: int, gid: str) -> None: ...
    def free(self, iid: str, job: int = -1) -> None: ...
    def after_free(self) -> None: ...
