"""The state store in process memory, for unit tests only: the interface and the semantics of ``RedisState``
(each method here mirrors one Lua script in ``lua/``; keep the two in step), without a server.

Every transition runs synchronously inside one call, so it is atomic like a Lua script; ``batch()`` queues
calls and ``run()`` applies them in order, like the Redis pipeline.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from shared.state.codec import CancelResult
from shared.state.model import (
    EXIT_TO_STATE,
    HistoryEntry,
    JobRecord,
    ReleaseResult,
    Reservation,
    ReserveResult,
    StoredGpu,
    StoredInstance,
    prio_score,
    shard_of,
)
from shared.state.reads import DerivedReads

_ACTIVE = ("placing", "running", "migrating")


def _idle(i: StoredInstance) -> None:
    i.state, i.job, i.prio, i.ls, i.mig, i.tenant, i.started, i.created = (
        "idle",
        None,
        0,
        False,
        True,
        "",
        0.0,
        False,
    )


class _Shard:
    def __init__(self) -> None:
        self.gpus: dict[str, StoredGpu] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.hist: dict[str, list[HistoryEntry]] = {}
        self.pending: dict[str, float] = {}
        self.cmds: dict[str, dict[str, Any]] = {}
        self.placing: dict[str, float] = {}
        self.nodes: dict[str, dict[str, str]] = {}
        self.occ = bytearray()


class MemoryBatch:
    def __init__(self, store: MemoryState) -> None:
        self.store = store
        self._calls: list[tuple[str, tuple[Any, ...]]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(MemoryState, "_t_" + name):
            raise AttributeError(name)

        def queue(*args: Any) -> int:
            self._calls.append((name, args))
            return len(self._calls) - 1

        return queue

    async def run(self) -> list[Any]:
        return [getattr(self.store, "_t_" + name)(*args) for name, args in self._calls]


class MemoryState(DerivedReads):
    """``RedisState``'s interface over dictionaries."""

    def __init__(self, namespace: str = "", shards: int = 1) -> None:
        self.namespace = namespace
        self.shards = shards
        self._s = [_Shard() for _ in range(shards)]

    def batch(self) -> MemoryBatch:
        return MemoryBatch(self)

    async def close(self) -> None:
        pass

    async def wipe(self) -> int:
        self._s = [_Shard() for _ in range(self.shards)]
        return 0

    def _js(self, job: str) -> _Shard:
        return self._s[shard_of(job, self.shards)]

    def _ns(self, node: str) -> _Shard:
        return self._s[shard_of(node, self.shards)]

    # --- helpers mirroring prelude.lua ----------------------------------------------------------------------
    def _save(self, sh: _Shard, g: StoredGpu, bump: bool | str = True) -> int:
        if bump:
            g.rev += 1
        if bump == "claim":
            g.ver += 1
        while len(sh.occ) <= g.pos:
            sh.occ.append(0)
        sh.occ[g.pos] = g.busy_mask
        return g.ver

    def _state(self, sh: _Shard, job: str, prev: str, to: str, reason: str, now: float) -> None:
        j = sh.jobs[job]
        j.state, j.reason, j.updated = to, reason, now
        self._hist(sh, job, prev, to, reason, now)
        if to == "placing":
            sh.placing[job] = now
        elif prev == "placing":
            sh.placing.pop(job, None)

    def _hist(self, sh: _Shard, job: str, prev: str, to: str, reason: str, now: float) -> None:
        sh.hist.setdefault(job, []).append(HistoryEntry(at=now, to=to, reason=reason, prev=prev))
        del sh.hist[job][:-64]

    def _requeue(self, sh: _Shard, job: str, prev: str, reason: str, now: float) -> None:
        j = sh.jobs[job]
        j.attempts += 1
        j.gpu = j.inst = j.node = j.mig_gpu = j.mig_inst = ""
        sh.pending[job] = prio_score(j.prio, j.at)
        self._state(sh, job, prev, "pending", reason, now)

    def _gpu(self, gpu_id: str) -> tuple[_Shard, StoredGpu | None]:
        sh = self._ns(gpu_id.rsplit("/", 1)[0])
        return sh, sh.gpus.get(gpu_id)

    # --- transitions (one per Lua script) -------------------------------------------------------------------
    def _t_reserve(self, r: Reservation, now: float) -> ReserveResult:
        sh = self._js(r.job_id)
        j = sh.jobs.get(r.job_id)

        def out(status: str, ver: int, detail: str = "") -> ReserveResult:
            return ReserveResult(status=status, job_id=r.job_id, gpu_id=r.gpu_id, ver=ver, detail=detail)

        if j is not None and j.state != "pending":
            return out("known", 0, j.state)
        g = sh.gpus.get(r.gpu_id)
        if g is None:
            return out("nogpu", 0)
        if g.ver != r.expected_ver:
            return out("conflict", g.ver, f"version {g.ver}")
        if not g.healthy:
            return out("unhealthy", g.ver)
        insts = copy.deepcopy(g.instances)
        new = copy.deepcopy(r.instance)
        if r.action == "reuse":
            i = next((x for x in insts if x.id == new.id), None)
            if i is None:
                return out("gone", g.ver, new.id)
            if i.state != "idle":
                return out("busy", g.ver, new.id)
            i.state, i.job, i.prio, i.ls, i.mig, i.tenant, i.created = (
                "reserved",
                r.job_id,
                new.prio,
                new.ls,
                new.mig,
                new.tenant,
                False,
            )
        else:
            for did in r.destroy:
                i = next((x for x in insts if x.id == did), None)
                if i is not None:
                    if i.state != "idle":
                        return out("busy", g.ver, did)
                    insts.remove(i)
            same = 0
            for i in insts:
                if i.mask & new.mask:
                    return out("overlap", g.ver, i.id)
                same += i.profile == new.profile
            if same >= r.max_count:
                return out("count", g.ver, new.profile)
            new.state, new.job, new.created = "reserved", r.job_id, True
            insts.append(new)
        g.instances = insts
        ver = self._save(sh, g, "claim")
        prev = ""
        if j is not None:
            prev = "pending"
            sh.pending.pop(r.job_id, None)
        else:
            j = sh.jobs[r.job_id] = JobRecord(
                job_id=r.job_id,
                state="",
                spec=r.spec,
                prio=r.prio,
                at=r.submitted_at,
                traceparent=r.traceparent,
            )
        j.gpu, j.inst, j.node = r.gpu_id, new.id, g.node
        self._state(sh, r.job_id, prev, "placing", r.reason, now)
        return out("ok", ver, str(j.attempts))

    def _t_enqueue(
        self, job: str, spec: bytes, prio: int, at: float, reason: str, now: float, traceparent: str = ""
    ) -> str:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is not None:
            if j.state == "pending":
                j.reason = reason
            return j.state
        sh.jobs[job] = JobRecord(job_id=job, state="", spec=spec, prio=prio, at=at, traceparent=traceparent)
        sh.pending[job] = prio_score(prio, at)
        self._state(sh, job, "", "pending", reason, now)
        return "queued"

    def _t_settle(self, job: str, to: str, reason: str, now: float, from_states: Iterable[str]) -> str:
        sh = self._js(job)
        j = sh.jobs.get(job)
        st = j.state if j else "-"
        if st not in tuple(from_states):
            return "noop"
        sh.pending.pop(job, None)
        if j is None:
            sh.jobs[job] = JobRecord(job_id=job, state="")
        self._state(sh, job, "" if st == "-" else st, to, reason, now)
        return "ok"

    def _t_release(
        self, job: str, kind: str, reason: str, now: float, instance_id: str = ""
    ) -> ReleaseResult:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None or j.state not in _ACTIVE:
            if j is not None and j.gpu and instance_id and instance_id == j.inst:
                _, g0 = self._gpu(j.gpu)
                if g0 is not None:
                    return ReleaseResult(
                        status="noop",
                        job_id=job,
                        state=j.state,
                        gpu_id=j.gpu,
                        node=j.node,
                        gpu=copy.deepcopy(g0),
                    )
            return ReleaseResult(status="noop", job_id=job, state=j.state if j else "")
        if instance_id and instance_id not in (j.inst, j.mig_inst):
            return ReleaseResult(status="stale", job_id=job, state=j.state, gpu_id=j.gpu, node=j.node)
        prev, gpu_id, node = j.state, j.gpu, j.node
        _, g = self._gpu(gpu_id)
        profile = ""
        assert g is not None
        for i in g.instances:
            if i.id == j.inst and i.job == job:
                profile = i.profile
                _idle(i)
        self._save(sh, g)
        if prev == "migrating" and j.mig_gpu:
            _, mg = self._gpu(j.mig_gpu)
            if mg is not None:
                for i in mg.instances:
                    if i.id == j.mig_inst and i.job == job:
                        _idle(i)
                self._save(sh, mg)
        j.mig_gpu = j.mig_inst = ""
        to = EXIT_TO_STATE[kind]
        if to == "pending":
            self._requeue(sh, job, prev, reason, now)
        else:
            self._state(sh, job, prev, to, reason, now)
        return ReleaseResult(
            status="ok",
            job_id=job,
            state=to,
            gpu_id=gpu_id,
            node=node,
            instance_id=instance_id,
            profile=profile,
            gpu=copy.deepcopy(g),
        )

    def _t_mark_running(self, job: str, instance_id: str, now: float, cmd_id: str = "") -> str:
        sh = self._js(job)
        if cmd_id:
            sh.cmds.pop(cmd_id, None)
        j = sh.jobs.get(job)
        if j is None or j.state != "placing":
            return "noop"
        if instance_id and instance_id != j.inst:
            return "stale"
        _, g = self._gpu(j.gpu)
        i = next((x for x in g.instances if x.id == j.inst), None) if g else None
        if g is None or i is None or i.job != job:
            return "gone"
        i.state, i.started, i.created = "busy", now, False
        self._save(sh, g, bump=False)
        self._state(sh, job, "placing", "running", "executor started the workload", now)
        return "ok"

    def _t_fail_placement(
        self, job: str, reason: str, now: float, max_attempts: int, cmd_id: str = ""
    ) -> tuple[str, str, str]:
        sh = self._js(job)
        if cmd_id:
            sh.cmds.pop(cmd_id, None)
        j = sh.jobs.get(job)
        if j is None or j.state != "placing":
            return ("noop", j.state if j else "", "")
        gpu_id = j.gpu
        _, g = self._gpu(gpu_id)
        assert g is not None
        i = next((x for x in g.instances if x.id == j.inst), None)
        if i is not None and i.job == job:
            if i.created:
                g.instances.remove(i)
            else:
                _idle(i)
        self._save(sh, g)
        if j.attempts + 1 >= max_attempts:
            j.attempts += 1
            self._state(sh, job, "placing", "failed", reason, now)
            return ("ok", "failed", gpu_id)
        self._requeue(sh, job, "placing", reason, now)
        return ("ok", "pending", gpu_id)

    def _t_cancel(self, job: str, reason: str, now: float) -> CancelResult:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None:
            sh.jobs[job] = JobRecord(job_id=job, state="")
            self._state(sh, job, "", "cancelled", reason, now)
            return CancelResult(status="cancelled")
        if j.state == "pending":
            sh.pending.pop(job, None)
            self._state(sh, job, "pending", "cancelled", reason, now)
            return CancelResult(status="cancelled")
        if j.state in _ACTIVE:
            j.cancel = True
            self._hist(sh, job, j.state, j.state, "cancel requested: " + reason, now)
            return CancelResult(status="stop", node=j.node, gpu_id=j.gpu, instance_id=j.inst)
        return CancelResult(status="noop", state=j.state)

    def _t_instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> str:
        sh, g = self._gpu(gpu_id)
        if g is None:
            return "nogpu"
        i = next((x for x in g.instances if x.id == instance_id), None)
        if i is None:
            return "gone"
        if op == "retire":
            if i.state != "idle":
                return "busy"
            i.state = "retiring"
            self._save(sh, g, "claim")
            return "ok"
        elif op == "drop":
            if i.state not in ("retiring", "idle"):
                return "busy"
            g.instances.remove(i)
        elif op == "restore":
            if i.state != "retiring":
                return "noop"
            i.state = "idle"
        self._save(sh, g)
        return "ok"

    def _t_migrate_reserve(
        self,
        job: str,
        src_instance: str,
        dst_gpu: str,
        dst_ver: int,
        inst: StoredInstance,
        destroy: Sequence[str],
        max_count: int,
        cooldown_s: float,
        reason: str,
        now: float,
    ) -> tuple[str, str]:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None or j.state != "running":
            return ("state", j.state if j else "")
        if j.inst != src_instance:
            return ("moved", j.inst)
        _, sg = self._gpu(j.gpu)
        _, dg = self._gpu(dst_gpu)
        src = next((x for x in sg.instances if x.id == j.inst), None) if sg else None
        if sg is None or src is None or src.job != job:
            return ("gone", j.inst)
        if not src.mig:
            return ("pinned", "")
        if src.moved > 0 and src.moved + cooldown_s > now:
            return ("cooldown", str(src.moved))
        if dg is None:
            return ("nogpu", dst_gpu)
        if dg.ver != dst_ver:
            return ("conflict", str(dg.ver))
        if not dg.healthy:
            return ("unhealthy", dst_gpu)
        dinsts = copy.deepcopy(dg.instances)
        for did in destroy:
            i = next((x for x in dinsts if x.id == did), None)
            if i is not None:
                if i.state != "idle":
                    return ("busy", did)
                dinsts.remove(i)
        new = copy.deepcopy(inst)
        same = 0
        for i in dinsts:
            if i.mask & new.mask:
                return ("overlap", i.id)
            same += i.profile == new.profile
        if same >= max_count:
            return ("count", new.profile)
        new.state, new.job, new.prio, new.ls, new.mig, new.tenant, new.created = (
            "target",
            job,
            src.prio,
            src.ls,
            False,
            src.tenant,
            True,
        )
        dinsts.append(new)
        if sg is dg:
            next(x for x in dinsts if x.id == src.id).moved = now
            dg.instances = dinsts
        else:
            src.moved = now
            dg.instances = dinsts
            self._save(sh, sg)
        self._save(sh, dg, "claim")
        j.mig_gpu, j.mig_inst = dst_gpu, new.id
        self._state(sh, job, "running", "migrating", reason, now)
        return ("ok", new.id)

    def _t_migrate_finish(self, op: str, job: str, reason: str, now: float) -> tuple[str, str]:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None or j.state != "migrating":
            return ("noop", j.state if j else "")
        _, sg = self._gpu(j.gpu)
        _, dg = self._gpu(j.mig_gpu)
        assert sg is not None and dg is not None
        src = next((x for x in sg.instances if x.id == j.inst), None)
        dst = next((x for x in dg.instances if x.id == j.mig_inst), None)
        if op == "commit":
            if dst is not None:
                dst.state, dst.mig, dst.moved = "busy", bool(src and src.mig), now
                dst.started, dst.created = (src.started if src else now) or now, False
            if src is not None and src.job == job:
                _idle(src)
            detail = f"{j.gpu}|{j.inst}"
            j.gpu, j.inst = j.mig_gpu, j.mig_inst
        else:
            if dst is not None and dst.job == job:
                dg.instances.remove(dst)
            detail = ""
        j.mig_gpu = j.mig_inst = ""
        if sg is not dg:
            self._save(sh, sg)
        self._save(sh, dg)
        self._state(sh, job, "migrating", "running", reason, now)
        return ("ok", detail)

    def _t_track_command(self, shard: int, cmd_id: str, info: dict[str, Any]) -> None:
        self._s[shard].cmds[cmd_id] = dict(info)

    # --- single-transition shortcuts, as RedisState ---------------------------------------------------------
    async def reserve(self, r: Reservation, now: float) -> ReserveResult:
        return self._t_reserve(r, now)

    async def enqueue(
        self,
        job_id: str,
        spec: bytes,
        prio: int,
        submitted_at: float,
        reason: str,
        now: float,
        traceparent: str = "",
    ) -> str:
        return self._t_enqueue(job_id, spec, prio, submitted_at, reason, now, traceparent)

    async def release(
        self, job_id: str, kind: str, reason: str, now: float, instance_id: str = ""
    ) -> ReleaseResult:
        return self._t_release(job_id, kind, reason, now, instance_id)

    async def mark_running(self, job_id: str, instance_id: str, now: float, cmd_id: str = "") -> str:
        return self._t_mark_running(job_id, instance_id, now, cmd_id)

    async def fail_placement(
        self, job_id: str, reason: str, now: float, max_attempts: int = 3, cmd_id: str = ""
    ) -> tuple[str, str, str]:
        return self._t_fail_placement(job_id, reason, now, max_attempts, cmd_id)

    async def cancel(self, job_id: str, reason: str, now: float) -> CancelResult:
        return self._t_cancel(job_id, reason, now)

    async def settle(self, job_id: str, to: str, reason: str, now: float, from_states: Iterable[str]) -> str:
        return self._t_settle(job_id, to, reason, now, tuple(from_states))

    async def instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> str:
        return self._t_instance(op, node, gpu_id, instance_id, now)

    async def register_node(
        self, node: str, gpus: list[dict[str, Any]], now: float, reg_id: str = ""
    ) -> dict[str, Any]:
        from shared.state.memory_nodes import register

        return register(self, self._ns(node), node, gpus, now, reg_id)

    async def node_lost(self, node: str, now: float, reason: str) -> dict[str, Any]:
        from shared.state.memory_nodes import lost

        return lost(self, self._ns(node), node, now, reason)

    async def heartbeat(self, nodes: Iterable[tuple[str, float]]) -> None:
        for node, at in nodes:
            self._ns(node).nodes.setdefault(node, {})["last_seen"] = repr(at)

    # --- reads ----------------------------------------------------------------------------------------------
    # -----------
    async def gpu_ids(self, shard: int | None = None) -> list[str]:
        shards = range(self.shards) if shard is None else (shard,)
        return [g for s in shards for g in sorted(self._s[s].gpus, key=lambda k: self._s[s].gpus[k].pos)]

    async def get_gpus(self, gpu_ids: Sequence[str]) -> list[StoredGpu | None]:
        return [copy.deepcopy(self._gpu(g)[1]) for g in gpu_ids]

    async def occupancy(self, shard: int = 0) -> bytes:
        return bytes(self._s[shard].occ)

    async def job(self, job_id: str) -> JobRecord | None:
        return copy.deepcopy(self._js(job_id).jobs.get(job_id))

    async def jobs(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        return [await self.job(j) for j in job_ids]

    async def history(self, job_id: str) -> list[HistoryEntry]:
        return list(self._js(job_id).hist.get(job_id, []))

    async def pending_ids(self, shard: int = 0, limit: int = -1) -> list[str]:
        p = self._s[shard].pending
        ids = sorted(p, key=lambda k: (p[k], k))
        return ids if limit < 0 else ids[:limit]

    async def pending(self, shard: int = 0, limit: int = 256) -> list[JobRecord]:
        return [j for j in await self.jobs((await self.pending_ids(shard))[:limit]) if j is not None]

    async def pending_count(self, shard: int | None = None) -> int:
        shards = range(self.shards) if shard is None else (shard,)
        return sum(len(self._s[s].pending) for s in shards)

    async def all_job_ids(self, shard: int) -> list[str]:
        return sorted(self._s[shard].jobs)

    async def nodes(self, shard: int | None = None) -> dict[str, dict[str, str]]:
        shards = range(self.shards) if shard is None else (shard,)
        return {n: dict(h) for s in shards for n, h in sorted(self._s[s].nodes.items())}

    async def dump(self, shard: int) -> tuple[list[StoredGpu], list[JobRecord], set[str], bytes]:
        return (
            await self.load_gpus(shard),
            [j for j in await self.jobs(await self.all_job_ids(shard)) if j],
            set(self._s[shard].pending),
            bytes(self._s[shard].occ),
        )

    async def commands(self, shard: int = 0) -> dict[str, dict[str, Any]]:
        return {k: msgspec.json.decode(msgspec.json.encode(v)) for k, v in self._s[shard].cmds.items()}

    async def placing_since(self, shard: int, before: float) -> list[str]:
        return sorted(j for j, t in self._s[shard].placing.items() if t <= before)

    async def forget_command(self, shard: int, cmd_id: str) -> None:
        self._s[shard].cmds.pop(cmd_id, None)
