"""A committed placement (``Placed``) -> the executor's ``place`` command, and its id.

Pure: the balancer sends the command right after its compare-and-set; the GPU view in ``Placed`` is the one the
compare-and-set proved current, so planning reads nothing. The node registry reads a command's id back
(``place_cmd_id``) to tell which attempt a report answers.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.stop_command import stop_command
from shared.events import Command, GangLaunch, MigMember, Placed, PlainSlot
from shared.mig.geometry import Geometry
from shared.policy.gpu_view import GpuView
from shared.policy.partition import MigOp, PartitionPlan, PlanConflict, new_instance_id, plan_partition
from shared.policy.placement.decision import Slot
from shared.state.model import PLAIN_PROFILES


def place_cmd_id(job_id: str, attempt: int) -> str:
    return f"place:{job_id}:{attempt}"


GANG_PORT_BASE = 29500
GANG_PORTS = 2000


def gang_port(job_id: str) -> int:
    """A gang's ``MASTER_PORT``: torchrun's default 29500 plus a spread by job, so that two gangs whose first
    members share a node rarely meet (a workload that sets ``MASTER_PORT`` itself keeps its own)."""
    return GANG_PORT_BASE + zlib.crc32(job_id.encode()) % GANG_PORTS


def _place(p: Placed, cmd_id: str, now: float, slot: Slot | None = None, **target: Any) -> Command:
    """The fields every place command of ``p`` has; ``target``: where it runs (index, instance, ops or plain);
    ``slot``: the first slot on the command's node (default: the placement's first)."""
    slot = slot or p.placement.slot
    return Command(
        id=cmd_id,
        cmd_id=cmd_id,
        kind="place",
        node=slot.node,
        gpu_id=slot.gpu_id,
        job_id=p.job_id,
        workload=p.job.workload,
        duration_s=p.job.duration_hint_s,
        at=now,
        submitted_at=p.job.submitted_at,
        stop_jobs=p.preempted,
        **target,
    )


def _plain_slots(p: Placed, slots: Sequence[Slot]) -> tuple[PlainSlot, ...]:
    """The bindings of non-MIG slots; the instance ids are the ones the balancer reserved (``new_instance_id``
    of each slot)."""
    return tuple(
        PlainSlot(
            gpu_index=int(s.gpu_id.rsplit("/", 1)[1]),
            instance_id=new_instance_id(s.gpu_id, s.profile, s.start, p.job_id),
            profile="shared" if s.profile == "shared" else "gpu",
            replica=s.start if s.profile == "shared" else 0,
        )
        for s in slots
    )


def members(p: Placed) -> dict[str, list[Slot]]:
    """A placement's slots by node, nodes in rank order (the slots come in rank order)."""
    out: dict[str, list[Slot]] = {}
    for s in p.placement.slots:
        out.setdefault(s.node, []).append(s)
    return out


def _plain_place_commands(p: Placed, cmd_id: str, now: float, master_addr: str) -> list[Command]:
    """A placement on non-MIG GPUs: no ops, the workload bound to the GPUs. One share or one whole GPU is one
    command; a gang (``gpus: n``, n > 1) is one command per member node, each with its part's ``GangLaunch``
    (ids ``<cmd_id>/<node rank>`` when it spans nodes, as the reservation tracked them)."""
    by_node = members(p)
    if len(p.placement.slots) == 1:
        slots = _plain_slots(p, p.placement.slots)
        return [_place(p, cmd_id, now, gpu_index=slots[0].gpu_index, instance_id=slots[0].instance_id,
                       plain=slots)]
    hosts = tuple(by_node)
    out, rank = [], 0
    for k, node_slots in enumerate(by_node.values()):
        slots = _plain_slots(p, node_slots)
        gang = _gang_launch(p, hosts, k, rank, master_addr)
        cid = f"{cmd_id}/{k}" if len(hosts) > 1 else cmd_id
        out.append(_place(p, cid, now, node_slots[0], gpu_index=slots[0].gpu_index,
                          instance_id=slots[0].instance_id, plain=slots, gang=gang))
        rank += len(node_slots)
    return out


def _gang_launch(p: Placed, hosts: tuple[str, ...], k: int, rank: int, master_addr: str) -> GangLaunch:
    return GangLaunch(launch=p.job.workload.launch or "per-gpu", world_size=len(p.placement.slots), first_rank=rank,
                      node_rank=k, hosts=hosts, master_addr=master_addr or hosts[0], master_port=gang_port(p.job_id))


def _mig_gang_commands(p: Placed, geometry: Geometry, cmd_id: str, now: float, master_addr: str,
                       views: Mapping[str, GpuView]) -> list[Command] | PlanConflict:
    """A gang on full-size MIG instances: one command per member node, whose ``ops`` make every member of that
    node (GPU by GPU, each planned from its own view) and whose ``mig_members`` name them in rank order."""
    by_node = members(p)
    hosts = tuple(by_node)
    out, rank = [], 0
    for k, node_slots in enumerate(by_node.values()):
        ops: list[MigOp] = []
        mig: list[MigMember] = []
        for s in node_slots:
            view = views.get(s.gpu_id)
            if view is None:
                return PlanConflict(gpu_id=s.gpu_id, reason="no view of the GPU to plan the gang member from")
            plan = plan_partition(view, geometry.model(s.model), s, p.job_id)
            if not isinstance(plan, PartitionPlan):
                return plan
            ops.extend(plan.ops)
            mig.append(MigMember(gpu_index=view.index, instance_id=plan.instance_id))
        cid = f"{cmd_id}/{k}" if len(hosts) > 1 else cmd_id
        out.append(_place(p, cid, now, node_slots[0], gpu_index=mig[0].gpu_index, instance_id=mig[0].instance_id,
                          ops=tuple(ops), mig_members=tuple(mig), gang=_gang_launch(p, hosts, k, rank, master_addr)))
        rank += len(node_slots)
    return out


def place_commands(p: Placed, geometry: Geometry, now: float, master_addr: str = "",
                   views: Mapping[str, GpuView] | None = None) -> list[Command] | PlanConflict:
    """The ``place`` commands of ``p``: one, or one per member node of a gang across nodes (MIG: destroy the
    idle instances in the way, create the instance at the exact placement, start the workload), or the
    conflict that forbids it (cannot happen after a compare-and-set on this view; a caller never acts on it but
    fails the placement). ``master_addr``: the first member node's declared address (a gang's rendezvous)."""
    cmd_id = place_cmd_id(p.job_id, p.attempt)
    slot = p.placement.slot
    if slot.profile in PLAIN_PROFILES:
        return _plain_place_commands(p, cmd_id, now, master_addr)
    if len(p.placement.slots) > 1:
        return _mig_gang_commands(p, geometry, cmd_id, now, master_addr, views or {})
    plan = plan_partition(p.gpu, geometry.model(slot.model), slot, p.job_id)
    if not isinstance(plan, PartitionPlan):
        return plan
    return [_place(p, cmd_id, now, gpu_index=p.gpu.index, ops=plan.ops, instance_id=plan.instance_id)]


def victim_stops(p: Placed, victims: Sequence[tuple[str, Sequence[str], Sequence[str]]], now: float) -> list[Command]:
    """A ``stop`` for each preempted job on each of its nodes that none of ``p``'s place commands goes to (a
    victim gang across nodes): the place commands stop the victims on their own nodes (``stop_jobs``).
    ``victims``: (job id, its GPU ids, its instance ids), one instance per GPU."""
    placed = {s.node for s in p.placement.slots}
    out: list[Command] = []
    for job, gpus, insts in victims:
        firsts: dict[str, tuple[str, str]] = {}
        for gpu, iid in zip(gpus, insts, strict=False):
            firsts.setdefault(gpu.rpartition("/")[0], (gpu, iid))
        for node, (gpu, iid) in firsts.items():
            if node in placed:
                continue
            cid = f"stop:{job}:preempted:{p.job_id}:{p.attempt}:{node}"  # one stream: an id per node
            out.append(stop_command(node, job, cid, gpu, iid, now, only_that_run=True))
    return out
