"""``AlignIndex``: the incremental index of the ``migsched`` rule, kept one GPU change at a time.

``migsched`` (``shared.policy.placement.plugins.migsched``) scores every usable GPU of a snapshot per decision:
two table gathers for its best candidate's static key, the best (tier, load, fit) class, then the time fields
for that class only. Yet a GPU's static key for a profile depends only on that GPU (its busy and idle masks and
the starts of its idle instances of the profile), and the time fields only on the GPU's and its node's expected
free time and the node's empty GPUs. So the index keeps, per GPU, its static key for every profile of its model
(memoised per GPU state), per (model, profile) the GPUs of each leading (tier, fit) class as a set, and per GPU
the time columns; it recomputes only the GPUs changed since the last decision. A
decision takes each model's smallest class, gives its GPUs their time fields, and hands these groups to the
rule's own choice (``migsched.choose``): any GPU outside them ranks after all of them. Only when a chosen GPU's
candidate is at its profile's max count may the answer lie outside, so then the choice is made again over every
GPU, as the policy's fallback does. The same keys, the same smallest (key, position): the same slot as the
policy over a snapshot of the same GPUs (``tests/unit/test_align_index.py`` checks it through random change
sequences).

Whole-GPU gangs that fit on one node, while every GPU is in MIG mode, go to the node the rule's own
``migsched.gang_head`` picks among the nodes with enough empty GPUs (counted per node), unless the rule keeps a
long one waiting (``long_gangs.waits``, over the same counts). The index answers only
for parameters whose leading fields never depend on the load (``supports``: no ``keep_empty`` below 1, no
``spread``); anything else goes to the policy with a snapshot. ``place`` returns the slots (all the simulator
reads); ``decide`` the explained ``Placement`` with its runners-up, for the balancer's mirror, which keeps one
index per shard as the simulator keeps one per run.

Pure: a data structure the caller drives with ``update``; no clock, I/O or randomness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel
from shared.mig.tables import tables_for
from shared.policy.cluster_snapshot import gpu_end
from shared.policy.gpu_view import GpuView
from shared.policy.placement.alignment import LEAD, UNFIT, AlignParams, Context, Group, table, trailing, trailing_one
from shared.policy.placement.class_columns import ClassColumns
from shared.policy.placement.decision import JobRequest, Placement, Slot
from shared.policy.placement.explain import whole_placement
from shared.policy.placement.gang import member_slots
from shared.policy.placement.gpu_times import GpuTimes, number_nodes
from shared.policy.placement.long_gangs import is_long, waits
from shared.policy.placement.plugins.migsched import choose, explain, gang_head, legal, slot_at, slot_of
from shared.policy.request import Demand, resolve_profile

_Tables = tuple[str, int, npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""Per profile of a model: its name, its column in the model's profile index, its create and reuse tables."""
_Asked = list[tuple[int, GpuModel, str]]


class AlignIndex:
    """``migsched``'s choice for MIG requests over GPUs that change one at a time (see the module docstring)."""

    memo_limit = 1 << 14
    """Static-key tuples kept by GPU state, and resolved demands (each emptied when full)."""
    few = 16
    """Best classes of at most this many GPUs in all are keyed one GPU at a time (``_few``), not as arrays."""

    def __init__(self, geometry: Geometry, gpus: Sequence[GpuView], params: AlignParams) -> None:
        if not self.supports(params):
            raise ValueError(f"the align index cannot answer for {params}: its leading fields depend on the load")
        self.geometry = geometry
        self.params = params
        self.gpus: list[GpuView] = list(gpus)
        self.position = {g.id: p for p, g in enumerate(self.gpus)}
        n = len(self.gpus)
        self.models, self.mid = _number_models(geometry, self.gpus)
        self._tables: list[list[_Tables]] = [
            [(p.name, tables_for(m).index[p.name], table(m, p.name, params.fit_steps, False, True),
              table(m, p.name, params.fit_steps, True, True)) for p in m.profiles]
            for m in self.models]
        self._index = [tables_for(m).index for m in self.models]
        """Per model slot: profile name -> its column (``tables_for`` hashes the model on every call)."""
        self._profile_at = [{name: j for j, (name, *_) in enumerate(tabs)} for tabs in self._tables]
        self._unfit = [(int(UNFIT),) * len(tabs) for tabs in self._tables]
        """Per model slot, the keys of a GPU with no candidate (one object: ``_rekey`` compares by identity)."""
        self.keys: list[tuple[int, ...]] = [self._unfit[k] for k in self.mid]
        """Per GPU: its static key for each profile of its model (UNFIT: unusable or no room)."""
        self.classes: list[list[dict[int, set[int]]]] = [[{} for _ in tabs] for tabs in self._tables]
        """Per model slot and profile (``_profile_at``): leading fields -> the GPUs whose static key leads with
        them (a GPU without a candidate is in none)."""
        self._memo: dict[tuple[int, int, tuple[int, ...]], tuple[int, ...]] = {}
        """Static keys by (model slot, busy << 8 | idle, idle starts per profile): a cluster shows few states."""
        self._moves: dict[tuple[tuple[int, ...], tuple[int, ...]], list[tuple[int, int | None, int | None]]] = {}
        """(old keys, new keys) -> the profiles whose key changed, each with its old and new class (``_moved``)."""
        self._nodes, self._node_of, self._node_at = number_nodes(self.gpus)
        self.times = GpuTimes(self._node_of, self._node_at)
        """What the keys' time fields read, per GPU and per node."""
        self._largest = max((len(at) for at in self._node_at), default=0)
        self._not_mig = {p for p, g in enumerate(self.gpus) if not g.mig}
        """GPUs not in MIG mode: while there is one, a gang may go to plain GPUs first, which only the policy
        answers."""
        self.columns = ClassColumns()
        """The large classes' positions and static keys, kept between decisions."""
        self._dirty: set[int] = set(range(n))
        self._asked: dict[Demand, list[tuple[int, GpuModel, str]]] = {}
        """Per demand, the (model slot, model, profile) it resolves to on each model that has one."""

    @staticmethod
    def supports(params: AlignParams) -> bool:
        """Whether the index answers for ``params``: the leading fields are the static key's alone."""
        return params.keep_empty >= 1.0 and not params.spread

    def update(self, gpu: GpuView) -> None:
        """``gpu`` (known by its id, same model and node) changed; it is keyed again when a request next asks."""
        pos = self.position[gpu.id]
        self.gpus[pos] = gpu
        self._dirty.add(pos)
        if not gpu.mig:  # kept at once: ``handles`` reads it for every queued gang
            self._not_mig.add(pos)
        elif self._not_mig:
            self._not_mig.discard(pos)

    def retime(self, pos: int, gpu: GpuView) -> None:
        """``gpu``, at ``pos``, differs from the GPU held there only in its instances' start or move times."""
        self.gpus[pos] = gpu

    def handles(self, demand: Demand) -> bool:
        """Whether ``place`` answers this demand: MIG requests; whole-GPU gangs that fit on one node while every
        GPU is in MIG mode (the policy tries plain GPUs first, and spreads bigger ones across nodes)."""
        kind = demand.kind
        return kind == "mig" or (kind == "gpus" and not self._not_mig and demand.gpus <= self._largest)

    def empty_on(self, node: str) -> int:
        """GPUs of ``node`` with no busy instance, in MIG mode and healthy (what a whole-GPU gang needs)."""
        self._catch_up()
        return self.times.node_count[self._nodes[node]]

    def place(self, demand: Demand, hint_s: float | None = None, now: float | None = None,
              submitted_at: float | None = None) -> tuple[Slot, ...] | None:
        """The policy's slots for a demand the index ``handles``, of a job of ``hint_s`` seconds submitted at
        ``submitted_at``, at ``now``, or None when it cannot place it now."""
        self._catch_up()
        ctx = Context.timed(now, hint_s, self.params, False, *self.times.columns[:3])
        if demand.kind == "gpus":
            waited = None if now is None or submitted_at is None else now - submitted_at
            return None if self.waits(demand.gpus, hint_s, waited) else self._place_gang(ctx, demand.gpus)
        asked = self._resolve(demand)
        few = self._few(ctx, asked)
        if few is not None:
            key, p, model, name = few
            gpu, prof = self.gpus[p], model.profile(name)
            if legal(gpu, prof, key):
                return (slot_at(gpu, model, prof, key),)
        got, _ = self._choose(ctx, asked, 1, scored=False)
        if got is None:
            return None
        key, g, gpu = got
        return (slot_of(gpu, g, key),)

    def decide(self, job: JobRequest, policy: str) -> Placement | None:
        """The policy's explained ``Placement`` (reasons, score, ``top_k`` runners-up) for a job whose demand the
        index ``handles``, or None when it cannot place it now (the policy then gives the reasons)."""
        self._catch_up()
        ctx = Context.timed(job.now, job.duration_hint_s, self.params, False, *self.times.columns[:3])
        if job.demand.kind == "gpus":
            if self.waits(job.demand.gpus, job.duration_hint_s, job.waited_s()):
                return None  # the policy gives the reason
            slots = self._place_gang(ctx, job.demand.gpus)
            return None if slots is None else whole_placement(job, slots, policy)
        got, groups = self._choose(ctx, self._resolve(job.demand), self.params.top_k + 1, scored=True)
        return None if got is None else explain(self.gpus, job, policy, got, groups, ctx, self.params)

    def waits(self, gpus: int, hint_s: float | None, waited_s: float | None) -> str | None:
        """Why a gang of ``gpus`` waits for headroom now (``shared.policy.placement.long_gangs``), or None."""
        if not is_long(self.params, gpus, hint_s, len(self.gpus)):
            return None
        self._catch_up()
        return waits(self.params, gpus, hint_s, waited_s, sum(self.times.node_count), len(self.gpus))

    def _resolve(self, demand: Demand) -> _Asked:
        """The (model slot, model, profile) ``demand`` resolves to on each model that has one."""
        asked = self._asked.get(demand)
        if asked is None:
            if len(self._asked) >= self.memo_limit:
                self._asked.clear()
            asked = self._asked[demand] = [(k, model, prof.name) for k, model in enumerate(self.models)
                                           if (prof := resolve_profile(demand, model)) is not None]
        return asked

    def _few(self, ctx: Context, asked: _Asked) -> tuple[int, int, GpuModel, str] | None:
        """The smallest (full key, position) over the best class of each model asked, with its model and
        profile, when those classes hold at most ``few`` GPUs in all; None when they hold more or none
        (``_choose`` answers). What ``choose`` takes first over ``_groups``'s arrays, keyed one GPU at a time
        (``trailing_one``): most decisions' best class is a handful of GPUs."""
        picks = []
        total = 0
        for k, model, name in asked:
            j = self._profile_at[k][name]
            classes = self.classes[k][j]
            if classes:
                members = classes[min(classes)]
                total += len(members)
                if total > self.few:
                    return None
                picks.append((j, members, model, name))
        best: tuple[int, int, GpuModel, str] | None = None
        t = self.times
        keys, ends, used, node_of, node_last, node_count = (self.keys, t.end, t.used, self._node_of, t.node_last,
                                                           t.node_count)
        params = self.params
        for j, members, model, name in picks:
            for p in members:
                nid = node_of[p]
                key = keys[p][j] | trailing_one(ctx, params, ends[p], node_last[nid], node_count[nid], used[p])
                if best is None or (key, p) < best[:2]:
                    best = (key, p, model, name)
        return best

    def _choose(self, ctx: Context, asked: _Asked, cover: int, scored: bool,
                ) -> tuple[tuple[int, Group, GpuView] | None, list[Group]]:
        """``choose`` over the smallest classes holding at least ``cover`` GPUs per model (1: the best class;
        more for runners-up), and the groups it chose from. ``scored``: the chosen key is full even when it is
        the only candidate (its score is reported)."""
        groups = self._groups(ctx, asked, cover, scored)
        got, at_max = choose(groups, ctx, self.params, self.gpus)
        if at_max:  # a best candidate at its max count: its GPU's next best may rank past other classes
            groups = self._groups(ctx, asked, 0, scored)
            got, _ = choose(groups, ctx, self.params, self.gpus)
        return got, groups

    def _place_gang(self, ctx: Context, n: int) -> tuple[Slot, ...] | None:
        """``n`` whole GPUs on the node the rule picks (``migsched.gang_head``), or None when no node has them."""
        empty, count = self.times.empty, self.times.node_count
        heads = [next(p for p in at if empty[p]) for nid, at in enumerate(self._node_at) if count[nid] >= n]
        if not heads:
            return None
        self.times.flush()
        head = gang_head(ctx, np.array(heads, dtype=np.intp))
        members = [self.gpus[p] for p in self._node_at[self._node_of[head]] if empty[p]]
        return member_slots(self.geometry, members, n)

    def _groups(self, ctx: Context, asked: _Asked, cover: int, scored: bool,
                ) -> list[Group]:
        """Per model asked, the GPUs with a candidate for its profile, each with its key: those of the smallest
        classes that together hold at least ``cover`` GPUs (0: every class), the best class's keys full (time
        fields and ties), the others' without them (``Group``; they rank after the best class anyway)."""
        out = []
        params = self.params
        self.times.flush()
        all_used = self.times.columns[3]
        for k, model, name in asked:
            j = self._profile_at[k][name]
            classes = self.classes[k][j]
            if not classes:
                continue
            leads = sorted(classes)
            taken = leads if cover <= 0 else leads[:1]
            count = len(classes[leads[0]])
            for lead in leads[1:] if cover > 0 else ():
                if count >= cover:
                    break
                taken.append(lead)
                count += len(classes[lead])
            sel, base = self._members(k, j, taken)
            used = all_used[sel]
            if not scored and cover == 1 and len(sel) == 1 and len(asked) == 1:
                # the one candidate there is: its time fields order nothing (``choose`` fills them in if its
                # candidate turns out to be at its max count)
                out.append(Group(model=model, prof=model.profile(name), pos=sel, keys=base.copy(), exact=False,
                                 known=0, used=used, base=base))
                continue
            if len(taken) == 1 or cover <= 0:  # every GPU listed has its full key
                out.append(Group(model=model, prof=model.profile(name), pos=sel,
                                 keys=base | trailing(ctx, params, sel, used), exact=True, known=len(sel),
                                 used=used, base=base))
                continue
            rows = np.flatnonzero((base & LEAD) == leads[0])
            full = base.copy()
            full[rows] |= trailing(ctx, params, sel[rows], used[rows])
            out.append(Group(model=model, prof=model.profile(name), pos=sel, keys=full, exact=False,
                             known=len(rows), used=used, base=base))
        return out

    def _members(self, k: int, j: int, leads: list[int],
                 ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
        """The GPUs of the classes ``leads`` of model slot ``k``'s profile ``j``, by position, with their static
        keys."""
        parts = [self.columns.read((k, j, lead), self.classes[k][j][lead], self.keys) for lead in leads]
        if len(parts) == 1:
            return parts[0]
        sel = np.concatenate([p for p, _ in parts])
        order = np.argsort(sel, kind="stable")
        return sel[order], np.concatenate([b for _, b in parts])[order]

    def _catch_up(self) -> None:
        """Key again every GPU changed since the last decision, then the time columns of their nodes."""
        if not self._dirty:
            return
        node_of = self._node_of
        for pos in self._dirty:
            self._rekey(pos)
        self.times.settle({node_of[p] for p in self._dirty})
        self._dirty.clear()

    def _rekey(self, pos: int) -> None:
        gpu = self.gpus[pos]
        k = self.mid[pos]
        tabs = self._tables[k]
        busy = gpu.busy_mask
        idle_starts = [0] * len(tabs)  # as the snapshot's idle_starts row, kept as a list: it keys the memo
        index = self._index[k]
        for inst in gpu.instances:
            if inst.job_id is None and (col := index.get(inst.profile)) is not None:
                idle_starts[col] |= 1 << inst.start
        ok = gpu.mig and gpu.healthy
        self.times.put(pos, gpu_end(gpu), gpu.used_compute, ok and not busy)
        keys = self._static(k, busy, gpu.idle_mask, idle_starts) if ok else self._unfit[k]
        old = self.keys[pos]
        if keys is old:  # memoised tuples: the same state keys to the same object
            return
        self.keys[pos] = keys
        moved = self._moves.get((old, keys))
        if moved is None:
            if len(self._moves) >= self.memo_limit:
                self._moves.clear()
            moved = self._moves[(old, keys)] = _moved(old, keys)
        classes, kept = self.classes[k], self.columns.kept_now
        for j, was, now in moved:
            sets = classes[j]
            if was is not None and was == now:  # re-keyed within its class
                if (hit := kept.get((k, j, was))) is not None:
                    hit[2].add(pos)
                continue
            if was is not None:
                members = sets[was]
                members.discard(pos)
                if not members:
                    del sets[was]
                    self.columns.emptied((k, j, was))
                elif (hit := kept.get((k, j, was))) is not None:
                    hit[2].add(pos)
            if now is not None:
                sets.setdefault(now, set()).add(pos)
                if (hit := kept.get((k, j, now))) is not None:
                    hit[2].add(pos)

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
        for k, j, lead in self.columns.kept():
            sel, base = self.columns.read((k, j, lead), self.classes[k][j][lead], self.keys)
            members = sorted(self.classes[k][j][lead])
            if sel.tolist() != members or base.tolist() != [self.keys[p][j] for p in members]:
                return False
        mine, theirs = self.times, fresh.times
        mine.flush()
        theirs.flush()
        return (self.keys == fresh.keys and self.classes == fresh.classes
                and all(np.array_equal(a, b) for a, b in zip(mine.columns, theirs.columns, strict=True))
                and (mine.end, mine.used, mine.empty, mine.node_last, mine.node_count)
                == (theirs.end, theirs.used, theirs.empty, theirs.node_last, theirs.node_count)
                and self._not_mig == fresh._not_mig)


def _moved(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[int, int | None, int | None]]:
    """Each profile whose static key changed from ``old`` to ``new``: (its column, its old class, its new class),
    a class being the key's leading fields (None: no candidate)."""
    return [(j, None if was == UNFIT else was & LEAD, None if now == UNFIT else now & LEAD)
            for j, (was, now) in enumerate(zip(old, new, strict=True)) if was != now]


def _number_models(geometry: Geometry, gpus: Sequence[GpuView]) -> tuple[list[GpuModel], list[int]]:
    """The models of ``gpus`` in order of first appearance, and each GPU's model slot."""
    models: list[GpuModel] = []
    slots: dict[str, int] = {}
    mid: list[int] = []
    for g in gpus:
        model = geometry.model(g.model)
        k = slots.get(model.name)
        if k is None:
            k = slots[model.name] = len(models)
            models.append(model)
        mid.append(k)
    return models, mid
