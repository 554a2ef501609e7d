"""An incremental twin of ``balancer.place_mig`` for a caller that changes one GPU at a time.

``place_mig`` scores every GPU of a snapshot per decision (a dozen numpy calls over 1,000-entry columns).
Yet a GPU's best key for a request depends only on that GPU: its model, mode, health and instances (which
fix its busy and idle masks, its load and its idle instances per profile), its *signature*. A cluster shows
few distinct signatures, so this index numbers them, keeps each GPU's signature number (recomputed only for
GPUs changed since the last decision) and, per resolved request, the packed int64 key of each signature (the
balancer's own tables and packing, so the keys are the same numbers, each computed once). A decision is a
gather of the keys of the GPUs' signatures and one argmin.

Exactness. ``place_mig`` picks the smallest (key, position) among every GPU's best reuse and best create
candidate, skipping a create candidate whose profile is at its max count there (its first pass takes the
overall best when that is legal, else it ranks everything and takes the first legal one: the same thing).
Per GPU that is ``min(best reuse, best create if its count allows it)``, so the argmin over the per-GPU keys
(first of equal keys = lowest position) is the balancer's choice; ``tests/unit/test_placement_index.py``
checks it against ``place`` over random states and request sequences. Only the choice is produced (a
``Slot``), not the reasons or runners-up of a ``Placement``.

Pure: a data structure the caller drives with ``update``; no clock, I/O or randomness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel, Profile
from shared.mig.tables import tables_for
from shared.policy.balancer import BalancerParams, _count_ok, _create_slot, _idle_at
from shared.policy.balancer_keys import _UNFIT, _compile_profiles, _Compiled, _tier_load
from shared.policy.placement import Slot
from shared.policy.request import Demand, full_profile, resolve_profile
from shared.policy.snapshot import GpuView

Signature = tuple[object, ...]
"""Everything a GPU's key depends on: model slot, usable, masks, load and (profile, start, busy) per
instance. GPUs with equal signatures have equal keys for every request, so keys are memoised by it."""


class _RequestKeys:
    """One resolved request's key per GPU signature (a GPU's key is its signature's)."""

    __slots__ = ("by_sig", "comp", "create", "filled", "reuse", "reused", "tier_load")

    def __init__(self, comp: _Compiled, tier_load: list[int]) -> None:
        self.comp = comp
        self.create = comp.create
        # plain lists: one GPU is scored with scalar look-ups, where numpy's per-call cost would dominate
        self.reuse = [(table, pidx.tolist()) for table, pidx in comp.reuse]
        self.tier_load = tier_load
        self.by_sig: npt.NDArray[np.int64] = np.full(64, _UNFIT, dtype=np.int64)
        """Per signature number: the best legal key of a GPU with that signature."""
        self.reused: list[bool] = []
        """Per signature number: that best candidate reuses an idle instance (not readable from the key: in
        ``delta`` mode a negative cost borrows from the action bit)."""
        self.filled = 0
        """Signature numbers below this are scored."""


class PlacementIndex:
    """Per-(resolved request) key columns over a fixed list of GPUs, kept up to date one GPU at a time.

    ``place(demand)`` returns exactly the slot ``balancer.place(snapshot, request, params)`` would choose for
    a ``mig`` demand on the snapshot of the same GPUs in the same order (None where it cannot place).
    """

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
        self._index = [tables_for(m).index for m in self.models]
        self._tier_load: list[int] = _tier_load(self.models, params.threshold, params.lazy_first).tolist()
        self.gpus = list(gpus)
        self.position = {g.id: p for p, g in enumerate(self.gpus)}
        self.sig: npt.NDArray[np.intp] = np.zeros(len(self.gpus), dtype=np.intp)
        """Per GPU, its signature's number, brought up to date (from the change log) when a request is asked:
        several changes between decisions cost one signature, shared by every request."""
        self._signatures: dict[Signature, int] = {}
        self._examples: list[tuple[GpuView, int]] = []
        """Per signature number: a GPU that had it and its model slot (what its keys are computed from)."""
        self._sigs_seen = -1
        self._requests: dict[tuple[Profile | None, ...], _RequestKeys] = {}
        self._resolved: dict[Demand, _RequestKeys] = {}
        # whole-GPU gangs: per node, the positions of GPUs with no busy instance that are in MIG mode and
        # healthy (place_whole's candidates); only while no GPU is out of MIG mode (else plain GPUs come first)
        self._not_mig: set[int] = set()
        self._empty: dict[str, set[int]] = {}
        per_node: dict[str, int] = {}
        for g in gpus:
            per_node[g.node] = per_node.get(g.node, 0) + 1
        self._largest = max(per_node.values(), default=0)
        """GPUs on the largest node: a bigger gang spans nodes, which the index does not answer."""
        for p, g in enumerate(self.gpus):
            self._empty.setdefault(g.node, set())
            self._track(p, g)
            if not g.mig:
                self._not_mig.add(p)
        self._log: list[int] = []
        """Positions of changed GPUs, in order: each consumer (the signatures, the gang sets) catches up from
        its own offset, so a change costs one append."""
        self._gangs_seen = 0
        self.log_limit = 1 << 16
        """Log length at which the part every consumer has read is dropped."""

    def __len__(self) -> int:
        return len(self.gpus)

    def _signature(self, pos: int, gpu: GpuView) -> Signature:
        return (
            self.mid[pos], gpu.mig and gpu.healthy, gpu.busy_mask, gpu.idle_mask, gpu.used_compute,
            tuple((i.profile, i.start, i.job_id is None) for i in gpu.instances),
        )

    def _catch_up_signatures(self) -> None:
        log = self._log
        if self._sigs_seen >= len(log):
            return
        changed = range(len(self.gpus)) if self._sigs_seen < 0 else set(log[self._sigs_seen:])
        self._sigs_seen = len(log)
        known, sig, gpus, mid = self._signatures, self.sig, self.gpus, self.mid
        for pos in changed:
            gpu = gpus[pos]
            # ``_signature``, inlined (a list, not a generator, for the instances: several times faster)
            s = (
                mid[pos], gpu.mig and gpu.healthy, gpu.busy_mask, gpu.idle_mask, gpu.used_compute,
                tuple([(i.profile, i.start, i.job_id is None) for i in gpu.instances]),
            )
            n = known.get(s)
            if n is None:
                n = known[s] = len(self._examples)
                self._examples.append((gpu, self.mid[pos]))
            sig[pos] = n

    def update(self, gpu: GpuView) -> None:
        """``gpu`` (known by its id) changed; its keys are recomputed when a request next asks."""
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

    def _compact(self) -> None:
        """Drop the part of the log every consumer has read."""
        # signatures never asked for (-1) will be computed for every GPU anyway: they hold nothing back
        done = min(self._gangs_seen, len(self._log) if self._sigs_seen < 0 else self._sigs_seen)
        if done > 0:
            del self._log[:done]
            self._gangs_seen -= done
            if self._sigs_seen >= 0:
                self._sigs_seen -= done

    def _catch_up_gangs(self) -> None:
        log = self._log
        if self._gangs_seen < len(log):
            for pos in set(log[self._gangs_seen:]):
                self._track(pos, self.gpus[pos])
            self._gangs_seen = len(log)

    def _track(self, pos: int, gpu: GpuView) -> None:
        if gpu.busy_mask == 0 and gpu.mig and gpu.healthy:
            self._empty[gpu.node].add(pos)
        else:
            self._empty[gpu.node].discard(pos)

    def empty_on(self, node: str) -> int:
        """GPUs of ``node`` with no busy instance, in MIG mode and healthy (what a whole-GPU gang needs)."""
        self._catch_up_gangs()
        return len(self._empty.get(node, ()))

    def handles(self, demand: Demand) -> bool:
        """Whether ``place`` answers this demand: MIG requests always; whole-GPU gangs while every GPU is in
        MIG mode (the balancer tries plain GPUs first) and they fit on one node; time-sliced shares never."""
        kind = demand.kind
        return kind == "mig" or (kind == "gpus" and not self._not_mig and demand.gpus <= self._largest)

    def _request(self, demand: Demand) -> _RequestKeys:
        req = self._resolved.get(demand)
        if req is None:
            # keyed on the resolutions, as the balancer's compile cache is: many demands share one
            profiles = tuple(resolve_profile(demand, m) for m in self.models)
            req = self._requests.get(profiles)
            if req is None:
                comp = _compile_profiles(
                    self.models, profiles, self.params.dynamic, self.params.allow_larger, self.delta
                )
                req = self._requests[profiles] = _RequestKeys(comp, self._tier_load)
            self._resolved[demand] = req
        return req

    def _key(self, req: _RequestKeys, gpu: GpuView, k: int) -> tuple[int, bool]:
        """The best legal key for the request of ``gpu`` (of model slot ``k``): ``place_mig``'s reuse and
        create keys, then the min; and whether it is the reuse candidate."""
        if not (gpu.mig and gpu.healthy):
            return _UNFIT, False
        tl = req.tier_load[(k << 4) | gpu.used_compute]
        best = _UNFIT
        comp = req.comp
        if req.reuse and (self._idle_profile_bits(k, gpu) & int(comp.idle_bits[k])):
            base = (k << 16) | (gpu.busy_mask << 8)
            starts = self._idle_starts(k, gpu)
            for table, pidx in req.reuse:
                v = int(table[base | starts.get(pidx[k], 0)])
                if v < best:
                    best = v
            best = best + tl if best < _UNFIT else _UNFIT
        reused = best < _UNFIT
        if req.create is not None:
            c = int(req.create[(k << 16) | (gpu.busy_mask << 8) | gpu.idle_mask])
            if c < _UNFIT:
                c += tl
                prof = comp.profiles[k]
                assert prof is not None
                if c < best and (len(prof.placements) <= prof.max_count or _count_ok(gpu, prof, 15 - (c & 0xF))):
                    best, reused = c, False
        return best, reused

    def _idle_profile_bits(self, k: int, gpu: GpuView) -> int:
        index = self._index[k]
        bits = 0
        for i in gpu.instances:
            if i.job_id is None and i.profile in index:
                bits |= 1 << index[i.profile]
        return bits

    def _idle_starts(self, k: int, gpu: GpuView) -> dict[int, int]:
        index = self._index[k]
        out: dict[int, int] = {}
        for i in gpu.instances:
            if i.job_id is None and i.profile in index:
                p = index[i.profile]
                out[p] = out.get(p, 0) | (1 << i.start)
        return out

    def place(self, demand: Demand) -> tuple[Slot, ...] | None:
        """The balancer's slots for a demand it ``handles``, or None when it cannot place it now."""
        if demand.kind == "gpus":
            return self._place_whole(demand.gpus)
        req = self._request(demand)
        self._catch_up_signatures()
        examples = self._examples
        if req.filled < len(examples):
            if len(examples) > req.by_sig.size:
                grown = np.full(2 * len(examples), _UNFIT, dtype=np.int64)
                grown[: req.filled] = req.by_sig[: req.filled]
                req.by_sig = grown
            for n in range(req.filled, len(examples)):
                key, reused = self._key(req, *examples[n])
                req.by_sig[n] = key
                req.reused.append(reused)
            req.filled = len(examples)
        keys = req.by_sig[self.sig]
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
        chosen = sorted((self.gpus[p] for p in sorted(self._empty[node])), key=self._whole_order)[:n]
        slots: list[Slot] = []
        for g in chosen:
            model = self.models[self.mid[self.position[g.id]]]
            full = full_profile(model)
            idle_full = next((i for i in g.instances if i.profile == full.name), None)
            if idle_full is not None:
                slots.append(Slot(gpu_id=g.id, node=g.node, model=model.name, profile=full.name, start=0,
                                  size=full.memory_slices, compute=full.compute_slices, action="reuse",
                                  instance_id=idle_full.id))
            else:
                slots.append(_create_slot(g, model, full, full.placements[0]))
        return tuple(slots)

    def _whole_order(self, g: GpuView) -> tuple[int, int, int]:
        full = full_profile(self.models[self.mid[self.position[g.id]]])
        has_full = any(i.profile == full.name for i in g.instances)
        return (0 if has_full else 1, g.idle_mask.bit_count(), g.index)
