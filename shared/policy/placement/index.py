"""The incremental cluster index of the seeds' balancer rule: the one the simulator and the balancer's mirror
keep, one GPU change at a time.

``balancer.place_mig`` scores every GPU of a snapshot per decision (a dozen numpy calls over the snapshot's
columns). Yet a GPU's keys for a request depend only on that GPU: its model, mode, health and instances, its
*signature*. A cluster shows few distinct signatures, so the index numbers them, keeps each GPU's signature
number (recomputed only for GPUs changed since the last decision, read from a change log) and, per resolved
request, the keys of each signature (computed once, with the balancer's own tables and packing, so they are the
same numbers). A decision is then a few gathers and one argmin.

It answers two ways, from the same keys:

- ``place(demand)``: the chosen slots only (the simulator). ``place_mig`` picks the smallest (key, position)
  among every GPU's best reuse and best create candidate, skipping a create candidate whose profile is at its
  max count there. Per GPU that is ``min(best reuse, best create if its count allows it)``, so the argmin over
  the per-GPU keys (first of equal keys: the lowest position) is the balancer's choice.
- ``decide(job)``: the full ``Placement`` with tier, FragCost, reasons and runners-up (the mirror). Runners-up
  are cut by ``argpartition``, whose choice among equal keys depends on the whole key array, so this builds
  ``place_mig``'s very reuse and create arrays and hands them to the balancer's own ``_shortlist``,
  ``_first_legal`` and ``explain_shortlist``.

Whole-GPU gangs on one node are answered from per-node sets of empty GPUs (``place_whole``'s choice while every
GPU is in MIG mode). Both answers are ``balancer.place``'s by construction; ``tests/unit/test_placement_index.py``
and ``tests/unit/test_balancer_mirror_decisions.py`` check it through random change sequences. Where only
``balancer.place`` can answer (time-sliced shares, plain GPUs, no room with its per-GPU reasons, a best create
candidate at its profile's max count for ``decide``), the index answers None.

Pure: a data structure the caller drives with ``update``; no clock, I/O or randomness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel, Profile
from shared.mig.tables import tables_for
from shared.policy.placement.balancer import (
    BalancerParams,
    _count_ok,
    _create_slot,
    _first_legal,
    _idle_at,
    _shortlist,
    explain_shortlist,
)
from shared.policy.placement.balancer_keys import _UNFIT, _compile_profiles, _Compiled, _tier_load
from shared.policy.placement.decision import JobRequest, Placement, Slot
from shared.policy.placement.explain import whole_placement
from shared.policy.placement.slots import full_slot, whole_order
from shared.policy.request import Demand, resolve_profile
from shared.policy.snapshot import GpuView

Signature = tuple[object, ...]
"""Everything a GPU's keys depend on: model slot, usable, masks, load and (profile, start, busy) per
instance. GPUs with equal signatures have equal keys for every request, so keys are memoised by it."""

_EMPTY_POS: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
_EMPTY_KEYS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)


class _RequestKeys:
    """One resolved request's keys per signature number."""

    __slots__ = ("best", "ckey", "comp", "filled", "holds", "reuse", "reused", "rkey")

    def __init__(self, comp: _Compiled) -> None:
        self.comp = comp
        # plain lists: one GPU is scored with scalar look-ups, where numpy's per-call cost would dominate
        self.reuse = [(table, pidx.tolist()) for table, pidx in comp.reuse]
        self.best: npt.NDArray[np.int64] = np.full(64, _UNFIT, dtype=np.int64)
        """The best legal key (``place``'s per-GPU choice)."""
        self.reused: npt.NDArray[np.bool_] = np.zeros(64, dtype=np.bool_)
        """That best candidate reuses an idle instance (not readable from the key: in ``delta`` mode a negative
        cost borrows from the action bit)."""
        self.holds: npt.NDArray[np.bool_] = np.zeros(64, dtype=np.bool_)
        """Usable and holding an idle instance the request may take (``place_mig``'s ``rpos``)."""
        self.rkey: npt.NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        """Best reuse key plus tier and load, as ``place_mig``'s ``rkeys`` (unfit: _UNFIT plus them)."""
        self.ckey: npt.NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        """Create key plus tier and load, as ``place_mig``'s ``ckeys`` (not usable: _UNFIT)."""
        self.filled = 0
        """Signature numbers below this are scored."""

    def grow(self, n: int) -> None:
        for name in self.__slots__:
            old = getattr(self, name)
            if isinstance(old, np.ndarray):
                new = np.full(max(n, 2 * old.size), _UNFIT if name == "best" else 0, dtype=old.dtype)
                new[: old.size] = old
                setattr(self, name, new)


class PlacementIndex:
    """The balancer's keys over a fixed list of GPUs (the snapshot's order: ties go to the lowest position),
    kept up to date one GPU at a time."""

    signature_limit = 1 << 15
    """Distinct signatures kept (or twice the GPUs, if more) before they are numbered afresh from the current
    GPUs: bounds the memory of a long-lived caller, where states seen once and gone would otherwise be kept for
    every request."""

    def __init__(self, geometry: Geometry, gpus: Sequence[GpuView], params: BalancerParams) -> None:
        self.params = params
        self.delta = params.rank == "delta"
        model_ids: dict[str, int] = {}
        models: list[GpuModel] = []
        self.mid: list[int] = []
        for g in gpus:
            m = geometry.model(g.model)
            if m.name not in model_ids:
                model_ids[m.name] = len(models)
                models.append(m)
            self.mid.append(model_ids[m.name])
        # the snapshot's model order (first appearance), which the stacked tables are indexed by
        self.models = tuple(models)
        self.by_name = {m.name: m for m in models}
        self._index = [tables_for(m).index for m in self.models]
        self._tier_load: list[int] = _tier_load(self.models, params.threshold, params.lazy_first).tolist()
        self.gpus = list(gpus)
        self.position = {g.id: p for p, g in enumerate(self.gpus)}
        self.sig: npt.NDArray[np.intp] = np.zeros(len(self.gpus), dtype=np.intp)
        """Per GPU, its signature's number, brought up to date (from the change log) when a request is asked:
        several changes between decisions cost one signature, shared by every request."""
        self._forget_signatures()
        self._not_mig = {p for p, g in enumerate(self.gpus) if not g.mig}
        """Positions of GPUs out of MIG mode (plain GPUs, which ``balancer.place`` offers a gang first)."""
        # whole-GPU gangs: per node, the positions of GPUs with no busy instance that are in MIG mode and healthy
        self._empty: dict[str, set[int]] = {g.node: set() for g in self.gpus}
        per_node: dict[str, int] = {}
        for g in gpus:
            per_node[g.node] = per_node.get(g.node, 0) + 1
        self._largest = max(per_node.values(), default=0)
        """GPUs on the largest node: a bigger gang spans nodes, which the index does not answer."""
        self._log: list[int] = []
        """Positions of changed GPUs, in order: each consumer (the signatures, the gang sets) catches up from
        its own offset (-1: never read, rebuilt from every GPU when first asked), so a change costs one
        append."""
        self._gangs_seen = -1
        self.log_limit = 1 << 16
        """Log length at which the part every consumer has read is dropped."""

    def __len__(self) -> int:
        return len(self.gpus)

    def _forget_signatures(self) -> None:
        self._signatures: dict[Signature, int] = {}
        self._examples: list[tuple[GpuView, int]] = []
        """Per signature number: a GPU that had it and its model slot (what its keys are computed from)."""
        self._requests: dict[tuple[Profile | None, ...], _RequestKeys] = {}
        self._resolved: dict[Demand, _RequestKeys] = {}
        self._sigs_seen = -1

    def _signature(self, pos: int, gpu: GpuView) -> Signature:
        return (
            self.mid[pos], gpu.mig and gpu.healthy, gpu.busy_mask, gpu.idle_mask, gpu.used_compute,
            tuple([(i.profile, i.start, i.job_id is None) for i in gpu.instances]),
        )

    # -- changes -------------------------------------------------------------------------------------------

    def update(self, gpu: GpuView) -> None:
        """``gpu`` (known by its id, same model) changed; its keys are recomputed when a request next asks."""
        pos = self.position[gpu.id]
        self.gpus[pos] = gpu
        self._log.append(pos)
        if not gpu.mig:  # kept at once (not from the log): ``handles`` reads it on every queued gang
            self._not_mig.add(pos)
        elif self._not_mig:
            self._not_mig.discard(pos)
        if len(self._log) >= self.log_limit:
            self._compact()

    def retime(self, pos: int, gpu: GpuView) -> None:
        """``gpu``, at ``pos``, differs from the GPU held there only in its instances' times (start, last
        move), which no key depends on: the view is replaced, no key recomputed."""
        self.gpus[pos] = gpu

    def _compact(self) -> None:
        """Drop the part of the log every consumer has read (one that never read holds nothing back)."""
        seen = [s for s in (self._sigs_seen, self._gangs_seen) if s >= 0]
        done = min(seen, default=len(self._log))
        if done > 0:
            del self._log[:done]
            if self._gangs_seen >= 0:
                self._gangs_seen -= done
            if self._sigs_seen >= 0:
                self._sigs_seen -= done

    def _catch_up_signatures(self) -> None:
        log = self._log
        if self._sigs_seen >= len(log):
            return
        changed = range(len(self.gpus)) if self._sigs_seen < 0 else set(log[self._sigs_seen:])
        self._sigs_seen = len(log)
        known, sig, gpus, mid, examples = self._signatures, self.sig, self.gpus, self.mid, self._examples
        seen = len(examples)
        for pos in changed:
            gpu = gpus[pos]
            # ``_signature``, inlined (a list, not a generator, for the instances: several times faster)
            s = (
                mid[pos], gpu.mig and gpu.healthy, gpu.busy_mask, gpu.idle_mask, gpu.used_compute,
                tuple([(i.profile, i.start, i.job_id is None) for i in gpu.instances]),
            )
            n = known.get(s)
            if n is None:
                n = known[s] = len(examples)
                examples.append((gpu, mid[pos]))
            sig[pos] = n
        if len(examples) > seen and len(examples) > max(self.signature_limit, 2 * len(self.gpus)):
            # numbered afresh from the current GPUs: at most one signature each, under the limit
            self._forget_signatures()
            self._catch_up_signatures()

    def _catch_up_gangs(self) -> None:
        log = self._log
        if self._gangs_seen < 0:
            for s in self._empty.values():
                s.clear()
            changed: Sequence[int] | set[int] = range(len(self.gpus))
        elif self._gangs_seen < len(log):
            changed = set(log[self._gangs_seen:])
        else:
            return
        self._gangs_seen = len(log)
        for pos in changed:
            gpu = self.gpus[pos]
            if gpu.busy_mask == 0 and gpu.mig and gpu.healthy:
                self._empty[gpu.node].add(pos)
            else:
                self._empty[gpu.node].discard(pos)

    def agrees_with(self, gpus: Sequence[GpuView]) -> bool:
        """Whether the index holds ``gpus`` (its GPUs, in order) and keys each by its current signature and
        gang state, as one built from scratch would (for invariant checks)."""
        self._catch_up_signatures()
        self._catch_up_gangs()
        if len(gpus) != len(self.gpus) or any(a is not b for a, b in zip(gpus, self.gpus, strict=True)):
            return False
        for p, g in enumerate(gpus):
            if self._signatures.get(self._signature(p, g)) != int(self.sig[p]):
                return False
            if (p in self._empty[g.node]) != (g.busy_mask == 0 and g.mig and g.healthy):
                return False
        return self._not_mig == {p for p, g in enumerate(gpus) if not g.mig}

    # -- keys ----------------------------------------------------------------------------------------------

    def _request(self, demand: Demand) -> _RequestKeys:
        self._catch_up_signatures()
        req = self._resolved.get(demand)
        if req is None:
            # keyed on the resolutions, as the balancer's compile cache is: many sized demands share one
            profiles = tuple(resolve_profile(demand, m) for m in self.models)
            req = self._requests.get(profiles)
            if req is None:
                comp = _compile_profiles(self.models, profiles, self.params.dynamic, self.params.allow_larger,
                                         self.delta)
                req = self._requests[profiles] = _RequestKeys(comp)
            if len(self._resolved) >= 1 << 12:  # sized demands vary endlessly; their resolutions do not
                self._resolved.clear()
            self._resolved[demand] = req
        n = len(self._examples)
        if req.filled < n:
            if n > req.best.size:
                req.grow(n)
            for s in range(req.filled, n):
                self._score(req, s, *self._examples[s])
            req.filled = n
        return req

    def _score(self, req: _RequestKeys, s: int, gpu: GpuView, k: int) -> None:
        """``place_mig``'s numbers for one GPU of model slot ``k``, computed as its vectorised code computes
        them, and the best legal one."""
        ok = gpu.mig and gpu.healthy
        tl = self._tier_load[(k << 4) | gpu.used_compute]
        comp = req.comp
        best, reused, holds = _UNFIT, False, False
        if ok and req.reuse:
            index = self._index[k]
            bits = 0
            starts: dict[int, int] = {}
            for i in gpu.instances:
                if i.job_id is None and i.profile in index:
                    p = index[i.profile]
                    bits |= 1 << p
                    starts[p] = starts.get(p, 0) | (1 << i.start)
            holds = bool(bits & int(comp.idle_bits[k]))
            if holds:
                base = (k << 16) | (gpu.busy_mask << 8)
                raw = _UNFIT
                for table, pidx in req.reuse:
                    raw = min(raw, int(table[base | starts.get(pidx[k], 0)]))
                req.rkey[s] = raw + tl
                if raw < _UNFIT:
                    best, reused = raw + tl, True
        req.holds[s] = holds
        if comp.create is not None:
            c = int(comp.create[(k << 16) | (gpu.busy_mask << 8) | gpu.idle_mask]) if ok else _UNFIT
            req.ckey[s] = c + tl if ok else _UNFIT
            if c < _UNFIT and c + tl < best:
                prof = comp.profiles[k]
                assert prof is not None
                if len(prof.placements) <= prof.max_count or _count_ok(gpu, prof, 15 - ((c + tl) & 0xF)):
                    best, reused = c + tl, False
        req.best[s] = best
        req.reused[s] = reused

    # -- answers -------------------------------------------------------------------------------------------

    def handles(self, demand: Demand) -> bool:
        """Whether ``place`` answers this demand: MIG requests always; whole-GPU gangs while every GPU is in
        MIG mode (the balancer tries plain GPUs first) and they fit on one node; time-sliced shares never."""
        kind = demand.kind
        return kind == "mig" or (kind == "gpus" and not self._not_mig and demand.gpus <= self._largest)

    def empty_on(self, node: str) -> int:
        """GPUs of ``node`` with no busy instance, in MIG mode and healthy (what a whole-GPU gang needs)."""
        self._catch_up_gangs()
        return len(self._empty.get(node, ()))

    def place(self, demand: Demand, hint_s: float | None = None, now: float | None = None,
              submitted_at: float | None = None) -> tuple[Slot, ...] | None:
        """The balancer's slots for a demand the index ``handles``, or None when it cannot place it now. The
        balancer's rule reads no time: ``hint_s``, ``now`` and ``submitted_at`` are taken so that every
        simulator index is asked alike (``AlignIndex.place``)."""
        if demand.kind == "gpus":
            return self._place_whole(demand.gpus)
        req = self._request(demand)
        keys = req.best[self.sig]
        pos = int(keys.argmin())  # the first of equal keys: the lowest position, as place_mig
        key = int(keys[pos])
        if key >= _UNFIT:
            return None
        gpu = self.gpus[pos]
        model = self.models[self.mid[pos]]
        start = 15 - (key & 0xF)
        if req.reused[int(self.sig[pos])]:
            inst = _idle_at(gpu, start)
            return (Slot(
                gpu_id=gpu.id, node=gpu.node, model=model.name, profile=inst.profile, start=inst.start,
                size=inst.size, compute=inst.compute, action="reuse", instance_id=inst.id,
            ),)
        prof = req.comp.profiles[self.mid[pos]]
        assert prof is not None
        return (_create_slot(gpu, model, prof, start),)

    def decide(self, job: JobRequest, policy: str = "balancer") -> Placement | None:
        """Exactly ``balancer.place``'s ``Placement`` for a MIG request or a whole-GPU gang the index
        ``handles``; None where only ``balancer.place`` can answer (see the module docstring)."""
        demand = job.demand
        if not self.gpus:
            return None
        if demand.kind == "gpus":
            if not self.handles(demand):
                return None
            slots = self._place_whole(demand.gpus)
            return None if slots is None else whole_placement(job, slots)
        if demand.kind != "mig":
            return None
        req = self._request(demand)
        sig = self.sig
        ckeys = req.ckey[sig] if req.comp.create is not None else None
        rpos, rkeys = _EMPTY_POS, _EMPTY_KEYS
        if req.reuse:
            rpos = req.holds[sig].nonzero()[0]
            rkeys = req.rkey[sig[rpos]]
        cands = _shortlist(self.models, req.comp, self.mid, rpos, rkeys, ckeys, self.params.top_k)
        chosen = _first_legal(self.gpus, cands[:1])
        if chosen is None:
            return None
        return explain_shortlist(self.gpus, self.by_name, job, self.params, policy, chosen, cands)

    def _place_whole(self, n: int) -> tuple[Slot, ...] | None:
        """``balancer.place_whole``: the node with the fewest empty GPUs that still has ``n`` (ties to the
        lower node name), and on it GPUs with an idle full-size instance first, then the fewest idle slices,
        then the lower index."""
        self._catch_up_gangs()
        fitting = [(len(ps), node) for node, ps in self._empty.items() if len(ps) >= n]
        if not fitting:
            return None
        _, node = min(fitting)
        # position order first: the balancer's sort is stable over the snapshot's order
        models, mid, position = self.models, self.mid, self.position
        chosen = sorted((self.gpus[p] for p in sorted(self._empty[node])),
                        key=lambda g: whole_order(g, models[mid[position[g.id]]]))[:n]
        return tuple(full_slot(g, models[mid[position[g.id]]]) for g in chosen)
