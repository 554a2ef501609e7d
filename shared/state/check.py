"""Invariants of the cluster state, as a pure function over what the store holds (``migsched check`` calls
``await audit(store, geometry)``).

1. no two instances of a GPU overlap; every instance is a legal profile placement of the GPU's model;
2. no profile exceeds its max count on a GPU;
3. the occupancy byte of every GPU equals the busy mask of its instances;
4. every job is in exactly one known state; a pending job is in the queue and a queued job is pending;
5. an active job (placing/running/migrating) holds exactly the instance(s) it names (every slot of a gang),
   and each names it; every non-idle instance with a job belongs to an active job that names it, except a
   ``retiring`` one held for a job the node ran unbeknown to the state (being stopped, ``lua/node.lua``),
   which no active job may name;
6. sharing modes: no MIG instance on a non-MIG GPU and no plain instance (``gpu``, ``shared``) on a MIG GPU;
   a whole GPU is exclusive (its ``gpu`` instance is the only one); shares use distinct replicas
   ``0..replicas-1`` and at most ``replicas`` of them; plain instances are never idle;
7. every job in ``:done`` (the ended jobs ``lua/expire.lua`` deletes after the retention) is known and in a
   terminal state. A job expired whole (hash, history, ``:jobs``, ``:done`` in one script) is simply absent:
   nothing here expects an ended job to stay;
8. the tenants' usage counters (``:usage``) are the sum of the charges of the jobs counted in them, and every
   such job is active: a counter that drifted would let a quota be overshot, or keep a tenant waiting for room
   it has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from shared.errors import UnknownModelError
from shared.mig.geometry import Geometry
from shared.state.model import (
    ACTIVE_STATES,
    JOB_STATES,
    PLAIN_PROFILES,
    TERMINAL_STATES,
    JobRecord,
    StoredGpu,
    Violation,
)


def check_state(
    geometry: Geometry,
    gpus: Sequence[StoredGpu],
    jobs: Sequence[JobRecord],
    pending: set[str],
    occupancy: bytes | None = None,
    done: set[str] | None = None,
    usage: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Violation]:
    """``done``: the shard's ended jobs (``:done``); None skips rule 7. ``usage``: its usage counters
    (``StateStore.tenant_usage``); None skips rule 8."""
    out: list[Violation] = []
    holders: Holders = {}
    for g in gpus:
        out.extend(_gpu_violations(geometry, g, occupancy, holders))
    named: set[tuple[str, str]] = set()
    for j in jobs:
        out.extend(_job_violations(j, pending, holders, named))
    states = {j.job_id: j.state for j in jobs}
    out.extend(_orphans(holders, named, states))
    out.extend(Violation(kind="queue", subject=q, detail="queued but unknown") for q in pending - set(states))
    out.extend(_done_violations(done or set(), states))
    if usage is not None:
        out.extend(_usage_violations(jobs, usage))
    return out


Holders = dict[tuple[str, str], str]
"""(gpu, instance) -> the job its non-idle instance holds."""


def _gpu_violations(geometry: Geometry, g: StoredGpu, occupancy: bytes | None, holders: Holders) -> list[Violation]:
    """Rules 1-3 and 6 on one GPU; records in ``holders`` the job each of its instances holds."""
    try:
        model = geometry.model(g.model)
    except UnknownModelError:
        return [Violation(kind="model", subject=g.id, detail=f"unknown model {g.model!r}")]
    out = _plain_violations(g)
    seen = 0
    counts: Counter[str] = Counter()
    for i in g.instances:
        if i.job and i.state not in ("idle", "retiring"):  # retiring: a part being stopped
            holders[(g.id, i.id)] = i.job
        if i.profile in PLAIN_PROFILES or not g.mig:
            continue  # checked by _plain_violations
        if i.mask & seen:
            out.append(Violation(kind="overlap", subject=g.id, detail=f"{i.id} overlaps another instance"))
        seen |= i.mask
        counts[i.profile] += 1
        if not model.has_profile(i.profile):
            out.append(Violation(kind="profile", subject=g.id, detail=f"{i.id}: {model.name} has no {i.profile}"))
        elif i.start not in model.profile(i.profile).placements:
            detail = f"{i.id}: {i.profile} cannot start at {i.start}"
            out.append(Violation(kind="placement", subject=g.id, detail=detail))
    for prof, n in counts.items():
        if model.has_profile(prof) and n > model.profile(prof).max_count:
            detail = f"{n} x {prof} > max {model.profile(prof).max_count}"
            out.append(Violation(kind="count", subject=g.id, detail=detail))
    if occupancy is not None and g.pos < len(occupancy) and occupancy[g.pos] != g.busy_mask:
        detail = f"occupancy byte {occupancy[g.pos]:#04x} != busy mask {g.busy_mask:#04x}"
        out.append(Violation(kind="occupancy", subject=g.id, detail=detail))
    return out


def _job_violations(j: JobRecord, pending: set[str], holders: Holders, named: set[tuple[str, str]]) -> list[Violation]:
    """Rules 4 and 5 on one job; records in ``named`` the instances an active job names."""
    out: list[Violation] = []
    if j.state not in JOB_STATES:
        out.append(Violation(kind="state", subject=j.job_id, detail=f"unknown state {j.state!r}"))
    if (j.state == "pending") != (j.job_id in pending):
        where = "in" if j.job_id in pending else "not in"
        out.append(Violation(kind="queue", subject=j.job_id, detail=f"state {j.state} but {where} the queue"))
    if j.state not in ACTIVE_STATES:
        return out
    held = j.slots or ((j.gpu, j.inst),)
    if j.slots and j.slots[0] != (j.gpu, j.inst):
        out.append(Violation(kind="reservation", subject=j.job_id, detail=f"first slot is not {j.gpu} {j.inst}"))
    completed = _completed_parts(j.slots, holders, j.job_id)
    for gpu, inst in (*held, (j.mig_gpu, j.mig_inst)) if j.state == "migrating" else held:
        named.add((gpu, inst))
        if holders.get((gpu, inst)) != j.job_id and gpu.rpartition("/")[0] not in completed:
            detail = f"{j.state} on {gpu} {inst}, which does not hold it"
            out.append(Violation(kind="reservation", subject=j.job_id, detail=detail))
    return out


def _orphans(holders: Holders, named: set[tuple[str, str]], states: Mapping[str, str]) -> list[Violation]:
    """Rule 5's other half: an instance held by a job that does not name it (``~``: a node's unknown run)."""
    return [
        Violation(kind="orphan", subject=gpu,
                  detail=f"{inst} held by {job} ({states.get(job, 'unknown job')}) which does not name it")
        for (gpu, inst), job in holders.items()
        if not job.startswith("~") and (gpu, inst) not in named
    ]


def _done_violations(done: set[str], states: Mapping[str, str]) -> list[Violation]:
    """Rule 7: a live job listed as ended would be deleted under it (expire.lua skips it, but the record is
    wrong)."""
    out: list[Violation] = []
    for d in sorted(done):
        if d not in states:
            out.append(Violation(kind="done", subject=d, detail="listed as ended but unknown"))
        elif states[d] not in TERMINAL_STATES:
            out.append(Violation(kind="done", subject=d, detail=f"listed as ended but {states[d] or 'in no state'}"))
    return out


def _usage_violations(jobs: Sequence[JobRecord], usage: Mapping[str, Mapping[str, float]]) -> list[Violation]:
    """Rule 8: the counters against the charges of the jobs counted in them."""
    out: list[Violation] = []
    expected: dict[tuple[str, str], float] = {}
    for j in jobs:
        if not j.counted:
            continue
        if j.state not in ACTIVE_STATES:
            out.append(Violation(kind="usage", subject=j.job_id, detail=f"{j.state} but still counted in usage"))
        for resource, amount in j.usage.items():
            expected[(j.tenant, resource)] = expected.get((j.tenant, resource), 0.0) + amount
    counted = {(t, r): v for t, used in usage.items() for r, v in used.items()}
    for key in sorted(expected.keys() | counted.keys()):
        want, got = expected.get(key, 0.0), counted.get(key, 0.0)
        if abs(want - got) > 1e-6:
            out.append(Violation(kind="usage", subject=key[0],
                                 detail=f"counts {got:g} {key[1]}; its active jobs are charged {want:g}"))
    return out


async def audit(store: object, geometry: Geometry) -> list[Violation]:
    """Read everything of every shard from ``store`` (RedisState or MemoryState) and check it."""
    out: list[Violation] = []
    for shard in range(store.shards):  # type: ignore[attr-defined]
        if hasattr(store, "dump"):  # one consistent read (a live system keeps changing between reads)
            gpus_, jobs_, pend_, occ_, done_, usage_ = await store.dump(shard)
            out.extend(check_state(geometry, gpus_, jobs_, pend_, occ_, done_, usage_))
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


def _plain_violations(g: StoredGpu) -> list[Violation]:
    """The sharing-mode rules of one GPU (6. above)."""
    out: list[Violation] = []

    def bad(detail: str) -> None:
        out.append(Violation(kind="sharing", subject=g.id, detail=detail))

    plain = [i for i in g.instances if i.profile in PLAIN_PROFILES]
    if g.mig:
        for i in plain:
            bad(f"{i.id}: a {i.profile} instance on a GPU in MIG mode")
        return out
    for i in g.instances:
        if i.profile not in PLAIN_PROFILES:
            bad(f"{i.id}: MIG instance {i.profile} on a GPU not in MIG mode")
        elif i.state == "idle" or not i.job:
            bad(f"{i.id}: idle {i.profile} instance (plain instances exist only while a job holds them)")
    whole = [i for i in plain if i.profile == "gpu"]
    if whole and len(g.instances) > 1:
        bad(f"whole-GPU {whole[0].id} shares the GPU with {len(g.instances) - 1} other instance(s)")
    shares = [i for i in plain if i.profile == "shared"]
    if len(shares) > g.replicas:
        bad(f"{len(shares)} shares in use > replicas {g.replicas}")
    starts = [i.start for i in shares]
    if len(set(starts)) != len(starts):
        bad(f"two shares on one replica: {sorted(starts)}")
    for i in shares:
        if not 0 <= i.start < g.replicas:
            bad(f"{i.id}: replica {i.start} outside 0..{g.replicas - 1}")
    return out


def _completed_parts(slots: tuple[tuple[str, str], ...], holders: dict[tuple[str, str], str], job: str) -> set[str]:
    """The member nodes of a gang across nodes whose part completed while others run: the job holds none of that
    node's slots, and still holds some slot elsewhere (a node holding only some of its slots is a violation)."""
    by_node: dict[str, list[bool]] = {}
    for gpu, inst in slots:
        by_node.setdefault(gpu.rpartition("/")[0], []).append(holders.get((gpu, inst)) == job)
    if len(by_node) < 2:
        return set()
    gone = {n for n, held in by_node.items() if not any(held)}
    return gone if len(gone) < len(by_node) else set()
