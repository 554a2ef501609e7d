"""What the migration planner memoises across plans, as state its caller owns: the simulator's pull index keeps
one for the whole run, the migration-planner service one sized for a process that rebuilds its snapshot every
plan, and a caller that hands none gets a fresh one per plan (the same moves, found with more work).

Each memo is a function of immutable inputs (a GPU state, a model, a profile), so a memo only saves work and
never changes a plan.
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

from shared.mig.geometry import GpuModel, Profile
from shared.policy.gpu_view import GpuView, InstanceView

K = TypeVar("K")
V = TypeVar("V")

DEFAULT_SIZE = 1024
"""Measured on a live run (64 × 8 A100, 1,000 jobs/s, 150 s): target placements, 12,224 look-ups, 89 % hits
with no bound while new GPU states kept coming (1,352 distinct keys, ~400 new a minute at the end); the same
89 % with this bound (512: 86 %, 256: 80 %), which holds at most 2,048 entries (~2 MB with their signatures).
Hostable profiles: 9,470 look-ups, 967 distinct keys, 90 % hits with no bound and with this one (512: 88 %,
256: 82 %)."""


class Memo(Generic[K, V]):
    """A memo of at most ``2 × size`` entries that keeps what is asked again: new entries go to the current
    generation; when it holds ``size``, it becomes the previous one and the previous one is dropped; a hit in
    the previous generation is carried into the current one. An approximate LRU without per-hit bookkeeping:
    a key asked at least once per ``size`` new keys stays, a one-off goes within ``2 × size`` new keys, so
    the memo settles at its size as soon as that many distinct keys have come (rather than growing towards a
    large clear-all bound for as long as new GPU states keep appearing)."""

    __slots__ = ("_cur", "_prev", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("Memo needs size >= 1")
        self.size = size
        self._cur: dict[K, V] = {}
        self._prev: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        got = self._cur.get(key)
        if got is None:
            got = self._prev.get(key)
            if got is not None:
                self.put(key, got)
        return got

    def put(self, key: K, value: V) -> None:
        self._cur[key] = value
        if len(self._cur) >= self.size:
            self._prev, self._cur = self._cur, {}

    def clear(self) -> None:
        self._cur, self._prev = {}, {}

    def __len__(self) -> int:
        return len(self._cur) + len(self._prev)


StaticJobs = list[tuple[int, int, InstanceView]]
"""The jobs that may leave a view, with the FragCost change their removal brings (< 0 only), by (change,
start)."""


class _ViewRef(weakref.ref[GpuView]):
    """A weak reference to a view whose entry in ``ViewJobs`` is dropped when the view goes."""

    __slots__ = ("key", "owner")
    key: int
    owner: dict[int, tuple[_ViewRef, GpuModel, StaticJobs]]

    def __new__(cls, view: GpuView, owner: dict[int, tuple[_ViewRef, GpuModel, StaticJobs]]) -> _ViewRef:
        # the callback is taken by ``__new__``, not ``__init__``
        self = super().__new__(cls, view, _view_gone)
        self.key = id(view)
        self.owner = owner
        return self


def _view_gone(ref: weakref.ref[GpuView]) -> None:
    assert isinstance(ref, _ViewRef)
    got = ref.owner.get(ref.key)
    if got is not None and got[0] is ref:
        del ref.owner[ref.key]


class ViewJobs:
    """Per view (by id): its ``StaticJobs``. An entry lives only as long as its view (a weak reference; its id
    is not reused meanwhile): the simulator's views outlive plans, so their entries are hit plan after plan,
    whereas a service builds every snapshot anew, and entries holding its dead views kept their snapshots'
    freed objects' pymalloc arenas from being released (the planner's RSS grew by about 15 % over its first
    minutes under load)."""

    limit = 4096
    """Entries kept before all are dropped (views churn; the few most visited are what matters)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[_ViewRef, GpuModel, StaticJobs]] = {}

    def get(self, view: GpuView, model: GpuModel) -> StaticJobs | None:
        got = self._by_id.get(id(view))
        if got is None or got[0]() is not view or got[1] is not model:
            return None
        return got[2]

    def put(self, view: GpuView, model: GpuModel, jobs: StaticJobs) -> None:
        if len(self._by_id) >= self.limit:
            self._by_id.clear()
        self._by_id[id(view)] = (_ViewRef(view, self._by_id), model, jobs)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, view_id: object) -> bool:
        return view_id in self._by_id


class PlannerMemos:
    """The planner's memos across plans: each target's best placement of a source profile (by the target's
    model and instances), the profiles a target state can host (by the snapshot's models), and the movable
    jobs of each unchanged view."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self.dst: Memo[tuple[int, tuple[tuple[str, int, bool], ...], int],
                       tuple[GpuModel, Profile, tuple[Profile, int] | None]] = Memo(size)
        """``PlanState.dst_placement`` by (id of the target's model, target's signature, id of the source
        profile); each entry keeps the model and profile referenced, so no id in its key is reused."""
        self.hostable: Memo[tuple[tuple[int, ...], int, tuple[tuple[str, int, bool], ...]],
                            tuple[GpuModel, tuple[GpuModel, ...], tuple[frozenset[str], ...]]] = Memo(size)
        """``hostable_on`` by identity of the models (hashing them costs more than the look-up); each entry
        keeps the target and the snapshot's models referenced."""
        self.view_jobs = ViewJobs()
