"""``AlignIndex``: the simulator's incremental index of the ``migsched`` rule, kept one GPU change at a time.

``migsched`` (``shared.policy.placement.plugins.migsched``) scores every usable GPU of a snapshot per decision:
two table gathers for its best candidate's static key, the best (tier, load, fit) class, then the time fields
for that class only. Yet a GPU's static key for a profile depends only on that GPU (its busy and idle masks and
the starts of its idle instances of the profile), and the time fields only on the GPU's and its node's expected
free time and the node's empty GPUs. So the index keeps, per (model, profile), every GPU's static key as a
column and the GPUs of each leading (tier, fit) class as a set, and per GPU the time columns; it recomputes
only the GPUs changed since the last decision. A decision takes the smallest class, gives its GPUs their time
fields, and hands the groups to the rule's own choice (``migsched.choose``): the same keys, the same smallest
(key, position), the same max-count fallback, so the same slot as the policy over a snapshot of the same GPUs
(``tests/unit/test_align_index.py`` checks it through random change sequences).

It answers MIG requests only, and only for parameters whose leading fields never depend on the load
(``supports``: no ``keep_empty`` below 1, no ``spread``); anything else goes to the policy with a snapshot.
It returns slots, not an explained ``Placement``: the simulator reads only the slots.

Pure: a data structure the caller drives with ``update``; no clock, I/O or randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.tables import tables_for
from shared.policy.gpu_view import GpuView
from shared.policy.placement.alignment import LEAD, UNFIT, AlignParams, Context, Group, every, table, trailing
from shared.policy.placement.decision import Slot
from shared.policy.placement.plugins.migsched import choose, slot_of
from shared.policy.request import Demand, resolve_profile

_Tables = tuple[str, int, npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""Per profile of a model: its name, its column in the model's profile index, its create and reuse tables."""


class AlignIndex:
    """``migsched``'s choice for MIG requests over GPUs that change one at a time (see the module docstring)."""

    memo_limit = 1 << 14
    """Static-key tuples kept by GPU state (emptied when full)."""

    def __init__(self, geometry: Geometry, gpus: Sequence[GpuView], params: AlignParams) -> None:
        if not self.supports(params):
            raise ValueError(f"the align index cannot answer for {params}: its leading fields depend on the load")
        self.geometry = geometry
        self.params = params
        self.gpus: list[GpuView] = list(gpus)
        self.position = {g.id: p for p, g in enumerate(self.gpus)}
        n = len(self.gpus)
        self.models: list[GpuModel] = []
        self.mid: list[int] = []
        slots: dict[str, int] = {}
        for g in self.gpus:
            model = geometry.model(g.model)
            k = slots.get(model.name)
            if k is None:
                k = slots[model.name] = len(self.models)
                self.models.append(model)
            self.mid.append(k)
        self._tables: list[list[_Tables]] = [
            [(p.name, tables_for(m).index[p.name], table(m, p.name, params.fit_steps, False, True),
              table(m, p.name, params.fit_steps, True, True)) for p in m.profiles]
            for m in self.models]
        self._profile_at = [{name: j for j, (name, *_) in enumerate(tabs)} for tabs in self._tables]
        self.base: list[list[npt.NDArray[np.int64]]] = [
            [np.full(n, UNFIT, dtype=np.int64) for _ in tabs] for tabs in self._tables]
        """Per model slot and profile (``_profile_at``): each GPU's static key (UNFIT: another model, unusable or
        no room)."""
        self.classes: list[list[dict[int, set[int]]]] = [[{} for _ in tabs] for tabs in self._tables]
        """Per model slot and profile: leading fields -> the GPUs whose static key leads with them."""
        self._keys: list[tuple[int, ...]] = [(int(UNFIT),) * len(self._tables[k]) for k in self.mid]
        """Per GPU: its static key for each profile of its model (the columns' entries, as one tuple)."""
        self._memo: dict[tuple[int, int, tuple[int, ...]], tuple[int, ...]] = {}
        """Static keys by (model slot, busy << 8 | idle, idle starts per profile): a cluster shows few states."""
        self.ends = np.full(n, -math.inf)
        self.node_end = np.full(n, -math.inf)
        self.node_empty = np.zeros(n, dtype=np.int64)
        self.used = np.zeros(n, dtype=np.int64)
        self._end = [-math.inf] * n
        self._empty = [False] * n
        nodes: dict[str, int] = {}
        self._node_of: list[int] = []
        self._node_at: list[list[int]] = []
        for p, g in enumerate(self.gpus):
            nid = nodes.get(g.node)
            if nid is None:
                nid = nodes[g.node] = len(self._node_at)
                self._node_at.append([])
            self._node_of.append(nid)
            self._node_at[nid].append(p)
        self._every = every(n)
        self._dirty: set[int] = set(range(n))

    @staticmethod
    def supports(params: AlignParams) -> bool:
        """Whether the index answers for ``params``: the leading fields are the static key's alone."""
        return params.keep_empty >= 1.0 and not params.spread

    def update(self, gpu: GpuView) -> None:
        """``gpu`` (known by its id, same model and node) changed; it is keyed again when a request next asks."""
        pos = self.position[gpu.id]
        self.gpus[pos] = gpu
        self._dirty.add(pos)

    def retime(self, pos: int, gpu: GpuView) -> None:
        """``gpu``, at ``pos``, differs from the GPU held there only in its instances' start or move times."""
        self.gpus[pos] = gpu

    def handles(self, demand: Demand) -> bool:
        """Whether ``place`` answers this demand: MIG requests."""
        return demand.kind == "mig"

    def place(self, demand: Demand, hint_s: float | None = None, now: float | None = None,
              ) -> tuple[Slot, ...] | None:
        """The policy's slots for a MIG request of ``hint_s`` seconds at ``now``, or None when it cannot place
        it now."""
        self._catch_up()
        ctx = Context.timed(now, hint_s, self.params, False, self.ends, self.node_end, self.node_empty)
        groups: list[Group] = []
        for k, model in enumerate(self.models):
            prof = resolve_profile(demand, model)
            if prof is not None:
                groups.append(self._group(ctx, k, model, prof.name))
        got, _ = choose(groups, ctx, self.params, self.gpus)
        if got is None:
            return None
        key, g, gpu = got
        return (slot_of(gpu, g, key),)

    def _group(self, ctx: Context, k: int, model: GpuModel, name: str) -> Group:
        j = self._profile_at[k][name]
        base = self.base[k][j]
        classes = self.classes[k][j]
        keys = base.copy()
        known = 0
        if classes:
            sel = np.array(sorted(classes[min(classes)]), dtype=np.intp)
            keys[sel] |= trailing(ctx, self.params, sel, self.used[sel])
            known = len(sel)
        return Group(model=model, prof=model.profile(name), pos=self._every, keys=keys, exact=False, known=known,
                     used=self.used, base=base)

    def _catch_up(self) -> None:
        """Key again every GPU changed since the last decision, then the time columns of their nodes."""
        if not self._dirty:
            return
        nodes = set()
        for pos in self._dirty:
            self._rekey(pos)
            nodes.add(self._node_of[pos])
        self._dirty.clear()
        for nid in nodes:
            at = self._node_at[nid]
            end = max(self._end[p] for p in at)
            empty = sum(self._empty[p] for p in at)
            for p in at:
                self.node_end[p] = end
                self.node_empty[p] = empty

    def _rekey(self, pos: int) -> None:
        gpu = self.gpus[pos]
        k = self.mid[pos]
        tabs = self._tables[k]
        busy = gpu.busy_mask
        end = -math.inf
        idle_starts = [0] * len(tabs)
        index = tables_for(self.models[k]).index
        for inst in gpu.instances:
            if inst.job_id is not None:
                if inst.expected_end > end:
                    end = inst.expected_end
            else:
                col = index.get(inst.profile)
                if col is not None:
                    idle_starts[col] |= 1 << inst.start
        ok = gpu.mig and gpu.healthy
        self._end[pos] = end
        self.ends[pos] = end
        self._empty[pos] = ok and not busy
        self.used[pos] = gpu.used_compute
        keys = self._static(k, busy, gpu.idle_mask, idle_starts) if ok else (int(UNFIT),) * len(tabs)
        old = self._keys[pos]
        if keys == old:
            return
        self._keys[pos] = keys
        for j, (was, now) in enumerate(zip(old, keys, strict=True)):
            if was == now:
                continue
            self.base[k][j][pos] = now
            sets = self.classes[k][j]
            if was != UNFIT:
                members = sets[was & LEAD]
                members.discard(pos)
                if not members:
                    del sets[was & LEAD]
            if now != UNFIT:
                sets.setdefault(now & LEAD, set()).add(pos)

    def _static(self, k: int, busy: int, idle: int, idle_starts: list[int]) -> tuple[int, ...]:
        """A usable GPU's static key for each profile of model slot ``k``: its best create or reuse candidate."""
        sig = (k, (busy << 8) | idle, tuple(idle_starts))
        keys = self._memo.get(sig)
        if keys is None:
            if len(self._memo) >= self.memo_limit:
                self._memo.clear()
            pair, high = sig[1], busy << 8
            keys = self._memo[sig] = tuple(min(int(create[pair]), int(reuse[high | idle_starts[col]]))
                                           for _, col, create, reuse in self._tables[k])
        return keys

    def agrees_with(self, gpus: Sequence[GpuView]) -> bool:
        """Whether the index keys ``gpus`` (by position) as a fresh index would: its invariant."""
        fresh = AlignIndex(self.geometry, gpus, self.params)
        fresh._catch_up()
        self._catch_up()
        return (all(np.array_equal(a, b) for x, y in zip(self.base, fresh.base, strict=True)
                    for a, b in zip(x, y, strict=True))
                and self._keys == fresh._keys and self.classes == fresh.classes
                and np.array_equal(self.ends, fresh.ends) and np.array_equal(self.node_end, fresh.node_end)
                and np.array_equal(self.node_empty, fresh.node_empty) and np.array_equal(self.used, fresh.used))
