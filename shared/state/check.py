"""Invariants of the cluster state, as a pure function over what the store holds (``migsched check`` calls
``await audit(store, geometry)``).

1. no two instances of a GPU overlap; every instance is a legal profile placement of the GPU's model;
2. no profile exceeds its max count on a GPU;
3. the occupancy byte of every GPU equals the busy mask of its instances;
4. every job is in exactly one known state; a pending job is in the queue and a queued job is pending;
5. an active job (placing/running/migrating) holds exactly the instance it names, and that instance names it;
   every non-idle instance with a job belongs to an active job that names it (reservations match instances).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from shared.errors import UnknownModelError
from shared.mig.geometry import Geometry
from shared.state.model import ACTIVE_STATES, JOB_STATES, JobRecord, StoredGpu, Violation


def check_state(
    geometry: Geometry,
    gpus: Sequence[StoredGpu],
    jobs: Sequence[JobRecord],
    pending: set[str],
    occupancy: bytes | None = None,
) -> list[Violation]:
    out: list[Violation] = []
    holders: dict[tuple[str, str], str] = {}  # (gpu, instance) -> job
    for g in gpus:
        try:
            model = geometry.model(g.model)
        except UnknownModelError:
            out.append(Violation(kind="model", subject=g.id, detail=f"unknown model {g.model!r}"))
            continue
        seen = 0
        counts: Counter[str] = Counter()
        for i in g.instances:
            if i.mask & seen:
                out.append(
                    Violation(kind="overlap", subject=g.id, detail=f"{i.id} overlaps another instance")
                )
            seen |= i.mask
            counts[i.profile] += 1
            if not model.has_profile(i.profile):
                out.append(
                    Violation(kind="profile", subject=g.id, detail=f"{i.id}: {model.name} has no {i.profile}")
                )
            elif i.start not in model.profile(i.profile).placements:
                out.append(
                    Violation(
                        kind="placement",
                        subject=g.id,
                        detail=f"{i.id}: {i.profile} cannot start at {i.start}",
                    )
                )
            if i.job and i.state != "idle":
                holders[(g.id, i.id)] = i.job
        for prof, n in counts.items():
            if model.has_profile(prof) and n > model.profile(prof).max_count:
                out.append(
                    Violation(
                        kind="count",
                        subject=g.id,
                        detail=f"{n} x {prof} > max {model.profile(prof).max_count}",
                    )
                )
        if occupancy is not None and g.pos < len(occupancy) and occupancy[g.pos] != g.busy_mask:
            out.append(
                Violation(
                    kind="occupancy",
                    subject=g.id,
                    detail=f"occupancy byte {occupancy[g.pos]:#04x} != busy mask {g.busy_mask:#04x}",
                )
            )
    named: set[tuple[str, str]] = set()
    for j in jobs:
        if j.state not in JOB_STATES:
            out.append(Violation(kind="state", subject=j.job_id, detail=f"unknown state {j.state!r}"))
        if (j.state == "pending") != (j.job_id in pending):
            out.append(
                Violation(
                    kind="queue",
                    subject=j.job_id,
                    detail=f"state {j.state} but {'in' if j.job_id in pending else 'not in'} the queue",
                )
            )
        if j.state in ACTIVE_STATES:
            for gpu, inst in (
                ((j.gpu, j.inst), (j.mig_gpu, j.mig_inst)) if j.state == "migrating" else ((j.gpu, j.inst),)
            ):
                named.add((gpu, inst))
                if holders.get((gpu, inst)) != j.job_id:
                    out.append(
                        Violation(
                            kind="reservation",
                            subject=j.job_id,
                            detail=f"{j.state} on {gpu} {inst}, which does not hold it",
                        )
                    )
    states = {j.job_id: j.state for j in jobs}
    for (gpu, inst), job in holders.items():
        if job.startswith("~"):
            continue
        if (gpu, inst) not in named:
            out.append(
                Violation(
                    kind="orphan",
                    subject=gpu,
                    detail=f"{inst} held by {job} ({states.get(job, 'unknown job')}) which does not name it",
                )
            )
    known = set(states)
    for q in pending - known:
        out.append(Violation(kind="queue", subject=q, detail="queued but unknown"))
    return out


async def audit(store: object, geometry: Geometry) -> list[Violation]:
    """Read everything of every shard from ``store`` (RedisState or MemoryState) and check it."""
    out: list[Violation] = []
    for shard in range(store.shards):  # type: ignore[attr-defined]
        if hasattr(store, "dump"):  # one consistent read (a live system keeps changing between reads)
            gpus_, jobs_, pend_, occ_ = await store.dump(shard)
            out.extend(check_state(geometry, gpus_, jobs_, pend_, occ_))
            continue
        gpus = await store.load_gpus(shard)  # type: ignore[attr-defined]
        ids = await store.all_job_ids(shard)  # type: ignore[attr-defined]
        jobs = [j for j in await store.jobs(ids) if j is not None]  # type: ignore[attr-defined]
        pend = {j.job_id for j in await store.pending(shard, limit=10**9)}  # type: ignore[attr-defined]
        # a queued id whose job hash is missing would be dropped by pending(): read the raw queue too
        pend |= set(await store.pending_ids(shard)) if hasattr(store, "pending_ids") else set()
        occ = await store.occupancy(shard)  # type: ignore[attr-defined]
        out.extend(check_state(geometry, gpus, jobs, pend, occ))
    return out
