"""An exact screen of ``migration.plan_after_exit``: proof, from the exited GPU alone and the caller's pull
index, that the planner would plan no move, so a caller that keeps the index (the simulator) need not build
a snapshot and a plan for most exits.

After an exit the planner moves jobs only on a Busy GPU (intra moves), by emptying a Lazy GPU
(consolidation), or by pulling one into a Lazy GPU from a source whose bound is < 0 for it
(``PullSearch.best_pull``). The pull search visits only the index's ``heads`` for that target
(``shared.policy.migration.pull_index``; in its cooldown mode, sources whose movable jobs are all cooling down have
none), so when there is none, and the GPU is Lazy, no pull can be found: this screen says so with one
memoised look-up. Everything else (a Busy GPU with intra moves allowed, a consolidation that can start, a
target with candidate sources) is left to the planner: the screen says "no moves" only when the planner
would return ``()``. ``tests/unit/test_migration_gate.py`` checks that over random clusters and parameters.

Pure: no clock, I/O or randomness.
"""

from __future__ import annotations

from shared.mig.geometry import GpuModel
from shared.mig.tables import tables_for
from shared.policy.migration.memos import PlannerMemos
from shared.policy.migration.moves import MigrationParams
from shared.policy.migration.pull import hostable_on
from shared.policy.migration.pull_index import PullIndex
from shared.policy.migration.search import intra_by_starts
from shared.policy.snapshot import GpuView


def no_moves_after_exit(
    gpu: GpuView, model: GpuModel, models: tuple[GpuModel, ...], pulls: PullIndex, now: float,
    params: MigrationParams, model_ids: tuple[int, ...] | None = None, screen: DefragScreen | None = None,
) -> bool:
    """True only if ``plan_after_exit`` at ``now`` on a snapshot of the current state (whose model list is
    ``models``; ``model_ids``: their ids, if at hand) plans nothing after a job left ``gpu``. ``pulls`` must be
    up to date with that state. ``screen``: a defragmentation screen whose memo of intra bounds answers for a
    Busy GPU (any screen will do: the bound depends on the GPU alone)."""
    if params.max_moves <= 0 or not (gpu.mig and gpu.healthy):
        return True
    compute = model.compute_slices
    t_q = round(params.threshold * 1000)
    if round(gpu.used_compute * 1000 / max(compute, 1)) >= t_q:
        # Busy: only intra moves, none when the intra bound (a lower bound of ``best_intra``, the one
        # ``plan_defrag`` starts its search from) says no busy instance has a better placement: ~13 % of the
        # plans after an exit at 1,000 GPUs, all of them empty
        return not params.intra or (screen is not None and screen.intra_bound(gpu, model) >= 0)
    if params.consolidate and gpu.busy_mask and _may_consolidate(gpu, now, params):
        return False
    # a consolidation that cannot start plans nothing and leaves the pull to a fresh plan, as if never tried
    if not params.inter or (not params.pull_into_empty and gpu.busy_mask == 0):
        return True
    if pulls.t_q != t_q or not pulls.describes(now, params.cooldown_s):
        return False
    sig = tuple([(i.profile, i.start, i.job_id is not None) for i in gpu.instances])
    hostable = hostable_on(pulls.memos, models, model, sig, model_ids)
    return not any(hostable) or not pulls.any_head(gpu.used_compute, compute, hostable)


def _may_consolidate(gpu: GpuView, now: float, params: MigrationParams) -> bool:
    """Whether ``consolidate`` gets past its first checks on a fresh plan: some job, no more jobs than a
    plan's moves, every one movable to another GPU now (``PlanState.may_move``, nothing moved yet)."""
    jobs = [i for i in gpu.instances if i.job_id is not None]
    return bool(jobs) and len(jobs) <= params.max_moves and all(
        i.migratable and not i.latency_sensitive and now - i.last_moved_at >= params.cooldown_s for i in jobs
    )


Target = tuple[int, int, tuple[frozenset[str], ...]]
"""A Lazy pull target as the pull search sees it: used and total compute slices, and what it can host."""


class DefragScreen:
    """An exact screen of ``migration.plan_defrag`` for a caller that changes one GPU at a time: per GPU,
    whether it starts the tick's intra search (usable, Busy, and an intra bound < 0: ``PlanState.columns``)
    and, for a Lazy one, its pull target class. A tick plans nothing when no GPU starts the intra search and
    no target class has a pull-index head: the pulls then find no source (``no_moves_after_exit``'s argument,
    for every target at once). ``update`` the GPUs that changed; pure otherwise."""

    def __init__(self, params: MigrationParams, models: tuple[GpuModel, ...], n: int,
                 memos: PlannerMemos | None = None) -> None:
        self.params = params
        self._memos = memos if memos is not None else PlannerMemos()
        self.t_q = round(params.threshold * 1000)
        self._models = models
        self._model_ids = tuple(id(m) for m in models)
        self._intra: set[int] = set()
        self._class: list[Target | None] = [None] * n
        self._targets: dict[Target, int] = {}
        """Target class -> how many GPUs are in it (classes with no GPU are dropped)."""
        self._bounds: dict[tuple[int, int, tuple[tuple[str, int], ...]], int] = {}

    def update(self, p: int, gpu: GpuView, model: GpuModel) -> None:
        old = self._class[p]
        if old is not None:
            left = self._targets[old] - 1
            if left:
                self._targets[old] = left
            else:
                del self._targets[old]
        self._class[p] = None
        self._intra.discard(p)
        if not (gpu.mig and gpu.healthy):
            return
        compute = model.compute_slices
        if round(gpu.used_compute * 1000 / max(compute, 1)) >= self.t_q:
            if self.intra_bound(gpu, model) < 0:
                self._intra.add(p)
            return
        if not self.params.pull_into_empty and gpu.busy_mask == 0:
            return
        sig = tuple([(i.profile, i.start, i.job_id is not None) for i in gpu.instances])
        hostable = hostable_on(self._memos, self._models, model, sig, self._model_ids)
        if any(hostable):
            target = (gpu.used_compute, compute, hostable)
            self._class[p] = target
            self._targets[target] = self._targets.get(target, 0) + 1

    def intra_bound(self, gpu: GpuView, model: GpuModel) -> int:
        """``PlanState._intra_bound`` of one GPU: the best ``intra_by_starts`` over its busy instances'
        profiles (a profile with no busy instance adds 0)."""
        index = tables_for(model).index
        starts: dict[str, int] = {}
        for i in gpu.instances:
            if i.job_id is not None and i.profile in index:
                starts[i.profile] = starts.get(i.profile, 0) | 1 << i.start
        key = (id(model), gpu.busy_mask, tuple(sorted(starts.items())))
        got = self._bounds.get(key)
        if got is None:
            got = 0
            for name, bits in key[2]:
                got = min(got, int(intra_by_starts(model, name)[gpu.busy_mask << 8 | bits]))
            if len(self._bounds) >= 1 << 16:
                self._bounds.clear()
            self._bounds[key] = got
        return got

    def no_moves(self, pulls: PullIndex, now: float) -> bool:
        """True only if ``plan_defrag`` at ``now`` plans nothing on a snapshot of the state the screen and
        ``pulls`` (up to date at ``now``) describe."""
        params = self.params
        if params.max_moves <= 0:
            return True
        if params.intra and self._intra:
            return False
        if not params.inter:
            return True
        if pulls.t_q != self.t_q or not pulls.describes(now, params.cooldown_s):
            return False
        return not any(pulls.any_head(*target) for target in self._targets)

    def state(self) -> tuple[set[int], dict[Target, int]]:
        """(intra candidates, target classes with their GPU counts), for tests and invariant checks."""
        return set(self._intra), dict(self._targets)
