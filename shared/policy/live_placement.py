"""``balancer.place`` for a caller that changes one GPU at a time (the balancer service's mirror), with the
very same ``Placement`` (slots, tier, FragCost before and after, reasons and runners-up) at a fraction of the
cost per decision.

``place_mig`` scores every GPU per decision: a dozen numpy calls over the snapshot's columns (the per-GPU
reuse and create keys), then a shortlist and the explanation. Its runners-up are cut by ``argpartition``,
whose choice among equal keys depends on the whole key array, not on positions alone: exact runners-up need
exactly those arrays. ``KeyColumns`` builds them in three gathers: the keys of each GPU *signature*
(everything a GPU's keys depend on) are computed once per resolved request with the balancer's own tables,
and a GPU changed by the caller only gets its signature number again. The balancer's own ``_shortlist``,
``_first_legal`` and ``explain_shortlist`` then rank and explain, so the answer is ``place_mig``'s by
construction (``tests/unit/test_balancer_mirror_decisions.py`` checks it through random change sequences).

The choice is the argmin of those arrays, the one ``PlacementIndex`` makes: asking the index as well would
compute it twice (measured: a quarter more CPU per decision), so MIG requests are answered from the columns
alone and the index serves whole-GPU gangs (``place_whole``'s choice while every GPU is in MIG mode), built
at the first one.

``LivePlacer.place`` answers None where only ``balancer.place`` can: time-sliced shares and plain GPUs, no room
(its ``CannotPlace`` carries per-GPU reasons) and a best create candidate at its profile's max count (rare:
``place_mig`` then ranks every GPU). Pure: driven by ``update``; no clock, I/O or randomness.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.mig.geometry import Geometry, GpuModel, Profile
from shared.mig.tables import tables_for
from shared.policy.balancer import BalancerParams, _first_legal, _shortlist, explain_shortlist
from shared.policy.balancer_keys import _UNFIT, _compile_profiles, _Compiled, _tier_load
from shared.policy.gpu_view import GpuView
from shared.policy.placement import JobRequest, Placement
from shared.policy.placement_explain import whole_placement
from shared.policy.placement_index import PlacementIndex
from shared.policy.request import Demand, resolve_profile

_EMPTY_POS: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
_EMPTY_KEYS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)


class _ActionKeys:
    """One resolved request's ``place_mig`` keys per GPU signature number."""

    __slots__ = ("ckey", "comp", "filled", "holds", "reuse", "rkey")

    def __init__(self, comp: _Compiled) -> None:
        self.comp = comp
        self.reuse = [(table, pidx.tolist()) for table, pidx in comp.reuse]
        self.holds: npt.NDArray[np.bool_] = np.zeros(64, dtype=np.bool_)
        """The GPU is usable and holds an idle instance the request may take (``place_mig``'s ``rpos``)."""
        self.rkey: npt.NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        """Best reuse key plus tier and load, as ``place_mig``'s ``rkeys`` (unfit: _UNFIT plus them)."""
        self.ckey: npt.NDArray[np.int64] = np.zeros(64, dtype=np.int64)
        """Create key plus tier and load, as ``place_mig``'s ``ckeys`` (not usable: _UNFIT)."""
        self.filled = 0

    def grow(self, n: int) -> None:
        for name in ("holds", "rkey", "ckey"):
            old = getattr(self, name)
            new = np.zeros(max(n, 2 * old.size), dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)


class KeyColumns:
    """``place_mig``'s per-GPU key arrays over a fixed list of GPUs, memoised per signature: everything a
    GPU's keys depend on (model, usable, masks, load, idle instances)."""

    signature_limit = 1 << 15
    """Distinct signatures kept before they are numbered afresh from the current GPUs (bounds the memory of a
    long-lived caller: states seen once and gone would otherwise be kept for every request)."""

    def __init__(self, geometry: Geometry, gpus: Sequence[GpuView], params: BalancerParams) -> None:
        self.params = params
        self.delta = params.rank == "delta"
        ids: dict[str, int] = {}
        models: list[GpuModel] = []
        self.mid: list[int] = []
        for g in gpus:
            m = geometry.model(g.model)
            if m.name not in ids:
                ids[m.name] = len(models)
                models.append(m)
            self.mid.append(ids[m.name])
        self.models = tuple(models)
        self.by_name = {m.name: m for m in models}
        self._index = [tables_for(m).index for m in models]
        self._tier_load: list[int] = _tier_load(self.models, params.threshold, params.lazy_first).tolist()
        self.gpus = list(gpus)
        self.position = {g.id: p for p, g in enumerate(self.gpus)}
        self.sig: npt.NDArray[np.intp] = np.zeros(len(self.gpus), dtype=np.intp)
        self.not_mig = {p for p, g in enumerate(self.gpus) if not g.mig}
        """Positions of GPUs out of MIG mode (plain GPUs, which ``place`` offers a gang first)."""
        self._renumber()

    def _renumber(self) -> None:
        self._signatures: dict[tuple[object, ...], int] = {}
        self._examples: list[tuple[GpuView, int]] = []
        self._requests: dict[tuple[Profile | None, ...], _ActionKeys] = {}
        self._resolved: dict[Demand, _ActionKeys] = {}
        for p, g in enumerate(self.gpus):
            self.sig[p] = self._number(g, self.mid[p])

    def _number(self, gpu: GpuView, k: int) -> int:
        s = (k, gpu.mig and gpu.healthy, gpu.busy_mask, gpu.idle_mask, gpu.used_compute,
             tuple((i.profile, i.start) for i in gpu.instances if i.job_id is None))
        n = self._signatures.get(s)
        if n is None:
            n = self._signatures[s] = len(self._examples)
            self._examples.append((gpu, k))
        return n

    def update(self, gpu: GpuView) -> None:
        """``gpu`` (known by its id, same model) changed."""
        pos = self.position[gpu.id]
        self.gpus[pos] = gpu
        self.sig[pos] = self._number(gpu, self.mid[pos])
        if not gpu.mig:
            self.not_mig.add(pos)
        elif self.not_mig:
            self.not_mig.discard(pos)
        if len(self._examples) > self.signature_limit:
            self._renumber()

    def _request(self, demand: Demand) -> _ActionKeys:
        req = self._resolved.get(demand)
        if req is None:
            # keyed on the resolutions, as the balancer's compile cache is: many sized demands share one
            profiles = tuple(resolve_profile(demand, m) for m in self.models)
            req = self._requests.get(profiles)
            if req is None:
                comp = _compile_profiles(self.models, profiles, self.params.dynamic, self.params.allow_larger,
                                         self.delta)
                req = self._requests[profiles] = _ActionKeys(comp)
            if len(self._resolved) >= 1 << 12:  # sized demands vary endlessly; their resolutions do not
                self._resolved.clear()
            self._resolved[demand] = req
        n = len(self._examples)
        if req.filled < n:
            if n > req.holds.size:
                req.grow(n)
            for s in range(req.filled, n):
                self._score(req, s, *self._examples[s])
            req.filled = n
        return req

    def _score(self, req: _ActionKeys, s: int, gpu: GpuView, k: int) -> None:
        """``place_mig``'s numbers for one GPU, computed as its vectorised code computes them."""
        ok = gpu.mig and gpu.healthy
        tl = self._tier_load[(k << 4) | gpu.used_compute]
        comp = req.comp
        if comp.create is not None:
            req.ckey[s] = int(comp.create[(k << 16) | (gpu.busy_mask << 8) | gpu.idle_mask]) + tl if ok else _UNFIT
        holds = False
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
                best = _UNFIT
                for table, pidx in req.reuse:
                    best = min(best, int(table[base | starts.get(pidx[k], 0)]))
                req.rkey[s] = best + tl
        req.holds[s] = holds

    def explain(self, job: JobRequest, policy: str = "balancer") -> Placement | None:
        """``place_mig``'s ``Placement`` for a ``mig`` job, or None where it would rank every GPU or cannot
        place (ask ``place_mig``)."""
        req = self._request(job.demand)
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


class LivePlacer:
    """``KeyColumns`` for MIG requests and a ``PlacementIndex`` for whole-GPU gangs over the same GPUs in the
    same order (the snapshot's: ties go to the lowest position)."""

    def __init__(self, geometry: Geometry, gpus: Sequence[GpuView], params: BalancerParams) -> None:
        self.params = params
        self.geometry = geometry
        self.columns = KeyColumns(geometry, gpus, params)
        self._index: PlacementIndex | None = None
        """Built at the first gang: until then its change log would only grow."""

    def update(self, gpu: GpuView) -> None:
        """``gpu`` (known by its id, same model) changed."""
        self.columns.update(gpu)
        if self._index is not None:
            self._index.update(gpu)

    def place(self, job: JobRequest) -> Placement | None:
        """Exactly ``balancer.place(snapshot, job, params)`` where it is a ``Placement`` this can give; None
        where only ``balancer.place`` can answer (see the module docstring)."""
        demand = job.demand
        if not self.columns.gpus:
            return None
        if demand.kind == "mig":
            return self.columns.explain(job)
        if demand.kind != "gpus":
            return None
        if self.columns.not_mig:  # plain GPUs come first: ``place`` knows them
            self._index = None  # unread, its change log would only grow
            return None
        if self._index is None:
            self._index = PlacementIndex(self.geometry, self.columns.gpus, self.params)
        slots = self._index.place(demand)
        return None if slots is None else whole_placement(job, slots)
