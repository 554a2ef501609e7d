"""``MemoryState``'s slot helpers (mirrors those of ``lua/prelude.lua``): how a job leaves its instances, how
an instance idles or is held until its node confirms a stop, and which nodes a job's slots lie on. The
reservation itself is ``memory_reserve``."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from shared.state.model import (
    PLAIN_PROFILES,
    JobRecord,
    StoredInstance,
)


def idle(i: StoredInstance) -> None:
    """As ``idle`` in prelude.lua: the instance is kept for reuse, with no trace of its last job."""
    i.state, i.job, i.prio, i.ls, i.mig, i.tenant, i.started, i.created, i.pre, i.ends = (
        "idle",
        None,
        0,
        False,
        True,
        "",
        0.0,
        False,
        True,
        0.0,
    )


def hold_for_stop(i: StoredInstance, job: str) -> None:
    """As ``hold_for_stop`` in prelude.lua: a job runs on ``i`` although the state does not hold it there; the
    instance stays occupied (``retiring`` with the job) until the node confirms the job is gone
    (``memory_nodes.stopped``)."""
    idle(i)
    i.state, i.job = "retiring", job


def give_back(insts: list[StoredInstance], gone: Iterable[StoredInstance], state: str) -> list[str]:
    """The idle instances a move's reserve removed from its target's way, back in ``insts`` as ``state`` (idle,
    or retiring until a destroy settles them) unless they overlap an instance there now (``lua/migrate.lua``
    abort, ``lua/release.lua``); returns their ids."""
    back: list[str] = []
    for was in gone:
        if any(i.id == was.id or i.mask & was.mask for i in insts):
            continue
        r = copy.deepcopy(was)
        idle(r)
        r.state = state
        insts.append(r)
        back.append(r.id)
    return back


def vacate(insts: list[StoredInstance], instance_id: str, job: str, drop_created: bool) -> StoredInstance | None:
    """The job leaves ``instance_id``: a MIG instance idles (removed when ``drop_created`` and its own
    reservation created it), a plain one is removed. None when the instance is not the job's."""
    i = next((x for x in insts if x.id == instance_id), None)
    if i is None or i.job != job:
        return None
    if i.profile in PLAIN_PROFILES or (drop_created and i.created):
        insts.remove(i)
    else:
        idle(i)
    return i


def node_of(gpu_id: str) -> str:
    """The node of a GPU id ``<node>/<index>`` (``node_of`` in prelude.lua)."""
    return gpu_id.rpartition("/")[0]


def inst_node(instance_id: str) -> str:
    """The node of an instance id ``<gpu id>:...``."""
    return node_of(instance_id.partition(":")[0])


def job_nodes(job: JobRecord) -> set[str]:
    """The nodes a job's placement holds: its slots' and its move target's (``holds_on`` in prelude.lua)."""
    nodes = {node_of(g) for g, _ in job.held()}
    if job.node:
        nodes.add(job.node)
    if job.mig_gpu:
        nodes.add(node_of(job.mig_gpu))
    return nodes


def spans(slots: Iterable[tuple[str, str]]) -> bool:
    """Whether a job's slots lie on several nodes (a gang across nodes)."""
    return len({node_of(g) for g, _ in slots}) > 1


def hold_members(
    store: Any, sh: Any, job: str, slots: Iterable[tuple[str, str]], but: str
) -> list[tuple[str, str, str]]:
    """As ``hold_members`` in prelude.lua: a gang across nodes that must end keeps its instances on nodes other
    than ``but`` taken (retiring with the job) until each node confirms a stop; one (node, gpu, instance) per
    node to stop."""
    stops: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for gid, iid in slots:
        _, g = store._gpu(gid)
        i = next((x for x in g.instances if x.id == iid), None) if g else None
        if g is None or i is None or i.job != job or node_of(gid) == but:
            continue
        hold_for_stop(i, job)
        store._save(sh, g, "claim")
        if node_of(gid) not in seen:
            seen.add(node_of(gid))
            stops.append((node_of(gid), gid, iid))
    return stops


def names(j: JobRecord, instance_id: str) -> bool:
    """The job's record names the instance: one of its slots or its migration target."""
    return instance_id in (j.inst, j.mig_inst) or any(iid == instance_id for _, iid in j.slots)
