"""The balancer's local mirror of one shard: the policies' snapshot columns plus each GPU's version.

Loaded from Redis at start, updated from transition results, reloaded per GPU after a lost compare-and-set and
in full every ``mirror_refresh_s``. Reservations decided in a batch are applied here at once (``apply``), so
the next decision of the same batch sees them and a batch never double-books a slice even before commit; the
expected version of the GPU moves with it, as the Lua script will move it.

Decisions (``decide``) go through an incremental index kept over the builder's GPUs in the builder's order (the
snapshot's), updated on every change and rebuilt at the next decision after the GPU set changes: the seeds'
balancer through its ``PlacementIndex``, ``migsched`` through its ``AlignIndex`` (the one the simulator keeps),
each giving the same ``Placement`` as the policy over a snapshot at a fraction of its cost. The policy itself
answers what the index cannot: held GPUs, topology domains, gangs across nodes, shares, a job it cannot place
(for the reasons).
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from shared.mig.geometry import Geometry
from shared.policy.partition import new_instance_id
from shared.policy.placement.align_index import AlignIndex
from shared.policy.placement.alignment import AlignParams
from shared.policy.placement.balancer import BalancerParams, place
from shared.policy.placement.decision import Decision, JobRequest, Slot
from shared.policy.placement.gang import gang_capacity, spans_nodes
from shared.policy.placement.index import PlacementIndex
from shared.policy.placement.registry import PlacementPolicy
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, SnapshotBuilder
from shared.state import StoredGpu, StoredInstance
from shared.state.model import PLAIN_PROFILES


class Kinds(msgspec.Struct, frozen=True, kw_only=True):
    """The kinds of GPU a mirror holds (lost nodes' included): what could ever host a MIG request or a share."""

    mig_models: frozenset[str]
    """The models of the GPUs in MIG mode."""
    shares: bool
    """Whether a GPU not in MIG mode is time-sliced (takes ``kind: shared`` jobs)."""
    gang_room: int = 0
    """The most GPUs one gang could hold here: those of the larger kind (``gang.gang_capacity``)."""


class Mirror:
    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.builder = SnapshotBuilder(geometry)
        self.vers: dict[str, int] = {}
        self._snap: ClusterSnapshot | None = None
        self._view: ClusterSnapshot | None = None
        self._placer: PlacementIndex | None = None
        """Built at the first decision after the GPU set changed (a new GPU): None until then."""
        self._aligner: AlignIndex | None = None
        """As ``_placer``, for ``migsched``."""
        self._kinds: Kinds | None = None
        """What kinds of GPU the mirror holds: built when asked after a GPU was added or changed identity."""

    def __len__(self) -> int:
        return len(self.builder)

    def snapshot(self) -> ClusterSnapshot:
        # cached until the next change: a batch of decisions that all end in "cannot place" copies once
        if self._snap is None:
            self._snap = self.builder.snapshot()
        return self._snap

    def view(self) -> ClusterSnapshot:
        """A snapshot over the builder's own columns, not copies of them (half a snapshot's cost, paid once
        per decision): valid only until this mirror next changes, so only for a reader that is done with it
        before then without awaiting anything (one ``place`` call, whose answer is applied next)."""
        if self._view is None:
            self._view = self.builder.snapshot(copy=False)
        return self._view

    def decide(
        self, job: JobRequest, params: BalancerParams, policy: PlacementPolicy | None = None,
        blocked: Collection[str] = (),
    ) -> Decision:
        """``policy(self.view(), job)``; without one, ``balancer.place(self.view(), job, params)``, through the
        placer where it can answer. GPUs in ``blocked`` (held for another job) look unusable to the policy. A gang
        kept within a topology domain or spanning nodes is the policy's own rule to apply (the placer keeps one
        node's GPUs)."""
        view = self.view().without(blocked)
        if policy is not None:
            align = getattr(policy, "align_params", None)
            if blocked or job.domains or not isinstance(align, AlignParams) or not AlignIndex.supports(align):
                return policy(view, job)
            return self._aligned(view, job, policy, align)
        if blocked or job.domains or spans_nodes(view, job.demand):
            return place(view, job, params)
        placer = self._placer
        if placer is None or placer.params != params:
            placer = self._placer = PlacementIndex(self.geometry, self.view().gpus, params)
        dec = placer.decide(job)
        return dec if dec is not None else place(self.view(), job, params)

    def _aligned(self, view: ClusterSnapshot, job: JobRequest, policy: PlacementPolicy, align: AlignParams,
                 ) -> Decision:
        """``policy(view, job)`` for ``migsched``, through the aligner where it can answer."""
        aligner = self._aligner
        if aligner is None or aligner.params != align:
            aligner = self._aligner = AlignIndex(self.geometry, view.gpus, align)
        if not aligner.handles(job.demand):  # a gang it does not handle spans nodes, or plain GPUs exist
            return policy(view, job)
        dec = aligner.decide(job, getattr(policy, "policy_name", "migsched"))
        return dec if dec is not None else policy(view, job)

    def _changed(self, gpu_id: str) -> None:
        self._snap = self._view = None
        if self._placer is not None:
            self._placer.update(self.builder.get(gpu_id))
        if self._aligner is not None:
            self._aligner.update(self.builder.get(gpu_id))

    def put(self, g: StoredGpu) -> None:
        self._put_view(g.view(), g.ver)

    def kinds(self) -> Kinds:
        """The kinds of GPU here: the models in MIG mode, whether any GPU is time-sliced, the room for a gang."""
        if self._kinds is None:
            view = self.view()
            gpus = view.gpus
            self._kinds = Kinds(mig_models=frozenset(g.model for g in gpus if g.mig),
                                shares=any(not g.mig and g.replicas >= 1 for g in gpus),
                                gang_room=gang_capacity(view))
        return self._kinds

    def _put_view(self, view: GpuView, ver: int) -> None:
        was = self.builder.get(view.id) if view.id in self.builder else None
        if was is None or (was.mig, was.replicas, was.model) != (view.mig, view.replicas, view.model):
            self._kinds = None
        if was is None or was.model != view.model:
            self._placer = self._aligner = None  # their GPU lists (and models) are fixed: built again when asked
        self.builder.put(view)
        self.vers[view.id] = ver
        self._changed(view.id)

    def holds_exactly(self, gpu_ids: Collection[str]) -> bool:
        """Whether the mirror holds these GPUs and no other (then a reload can update it in place)."""
        return len(gpu_ids) == len(self.builder) and all(g in self.builder for g in gpu_ids)

    def refresh(self, g: StoredGpu) -> bool:
        """``put`` unless the mirror already shows the GPU as stored (the periodic reload finds most GPUs
        unchanged: re-putting them would rebuild the placer for nothing); True if it changed."""
        view = g.view()
        if g.id in self.builder and self.vers.get(g.id) == g.ver and self.builder.get(g.id) == view:
            return False
        self._put_view(view, g.ver)
        return True

    def put_instances(self, gpu_id: str, instances: list[StoredInstance], ver: int) -> None:
        """Replace one GPU's instances (from a transition result that does not carry the GPU's identity)."""
        if gpu_id not in self.builder:
            return
        self.builder.put(self.builder.get(gpu_id).with_instances([i.view() for i in instances]))
        self.vers[gpu_id] = ver
        self._changed(gpu_id)

    def release(self, gpu_id: str, instance_id: str, job_id: str) -> bool:
        """The job left its instance: idle it here as the release transition did in Redis (a release does not
        move the CAS version). False when the mirror does not show that job there (then reload the GPU)."""
        if gpu_id not in self.builder:
            return False
        gpu = self.builder.get(gpu_id)
        inst = gpu.instance(instance_id)
        if inst is None or inst.job_id != job_id:
            return False
        if inst.profile in PLAIN_PROFILES:  # a whole GPU or a share: removed, as the release removed it
            self.builder.put(gpu.with_instances([i for i in gpu.instances if i.id != instance_id]))
            self._changed(gpu_id)
            return True
        idle = InstanceView(
            id=inst.id, profile=inst.profile, start=inst.start, size=inst.size, compute=inst.compute
        )
        self.builder.put(gpu.with_instances([idle if i.id == instance_id else i for i in gpu.instances]))
        self._changed(gpu_id)
        return True

    def get(self, gpu_id: str) -> GpuView:
        return self.builder.get(gpu_id)

    def apply(
        self, slot: Slot, job_id: str, inst: StoredInstance, victims: Collection[str] = ()
    ) -> int:
        """Apply one slot of a reservation locally; return the version the commit must find (the current one).
        ``victims``: jobs preempted by it, whose plain instances on this GPU go (their MIG ones idle, then are
        destroyed or reused per the slot)."""
        gpu = self.builder.get(slot.gpu_id)
        keep = [
            i
            for i in gpu.instances
            if i.id not in slot.destroy
            and i.id != inst.id
            and not (i.job_id in victims and i.profile in PLAIN_PROFILES)
        ]
        keep.append(
            InstanceView(
                id=inst.id,
                profile=inst.profile,
                start=inst.start,
                size=inst.size,
                compute=inst.compute,
                job_id=job_id,
                migratable=False,
                priority=inst.prio,
                tenant=inst.tenant,
                latency_sensitive=inst.ls,
                preemptible=inst.pre,
                ends_at=inst.ends if inst.ends > 0 else None,
            )
        )
        self.builder.put(gpu.with_instances(keep))
        expected = self.vers.get(slot.gpu_id, 0)
        self.vers[slot.gpu_id] = expected + 1
        self._changed(slot.gpu_id)
        return expected


def reservation_instance(
    slot: Slot, job_id: str, prio: int, tenant: str, ls: bool, mig: bool, ends: float = 0.0
) -> StoredInstance:
    """The instance a slot reserves: a reused one keeps its id; a new one gets the node registry's id for it.
    ``ends``: when the job is expected to end (0 = no hint)."""
    iid = (
        slot.instance_id
        if slot.action == "reuse" and slot.instance_id
        else new_instance_id(slot.gpu_id, slot.profile, slot.start, job_id)
    )
    return StoredInstance(
        id=iid,
        profile=slot.profile,
        start=slot.start,
        size=slot.size,
        compute=slot.compute,
        prio=prio,
        tenant=tenant,
        ls=ls,
        mig=mig and slot.profile not in PLAIN_PROFILES,  # a whole GPU or a share never moves
        ends=ends,
    )
