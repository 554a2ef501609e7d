"""The cluster-state store on Redis: every transition one Lua script (loaded once, called by EVALSHA), with a
compare-and-set on the GPU's version where a decision was made on a possibly stale view.

    state = RedisState.from_settings(settings)
    b = state.batch()                      # many transitions, one round trip (DESIGN §5)
    i = b.reserve(reservation, now)
    j = b.enqueue(job_id, spec, prio, submitted_at, "no room", now)
    res = await b.run(); res[i].ok

Single transitions have a shortcut each (``await state.release(...)``). Reads: ``load_gpus``, ``get_gpus``,
``snapshot``, ``occupancy``, ``job``, ``history``, ``pending``, ``nodes``, ``commands``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from shared.errors import MigschedError
from shared.mig.geometry import Geometry
from shared.policy.snapshot import ClusterSnapshot, SnapshotBuilder
from shared.state.keys import Keys
from shared.state.model import (
    EXIT_TO_STATE,
    HistoryEntry,
    JobRecord,
    ReleaseResult,
    Reservation,
    ReserveResult,
    StoredGpu,
    StoredInstance,
    shard_of,
)

_ENC = msgspec.json.Encoder()
_INSTS = msgspec.json.Decoder(list[StoredInstance])
_HIST = msgspec.json.Decoder(HistoryEntry)
SCRIPTS = (
    "reserve",
    "enqueue",
    "settle",
    "release",
    "mark_running",
    "fail_placement",
    "cancel",
    "instance",
    "migrate",
    "node",
    "dump",
)


class StateError(MigschedError):
    """Redis refused a transition (a script error, not a lost race: races are results)."""


@functools.cache
def script_source(name: str) -> str:
    lua = resources.files("shared.state").joinpath("lua")
    return lua.joinpath("prelude.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def decode_instances(raw: Any) -> list[StoredInstance]:
    if not raw or raw in (b"{}", b"[]", "{}", "[]"):
        return []
    return _INSTS.decode(raw)


def decode_gpu(gpu_id: str, h: dict[bytes, bytes]) -> StoredGpu | None:
    if not h:
        return None
    g = {k.decode(): v for k, v in h.items()}
    return StoredGpu(
        id=gpu_id,
        node=_s(g.get("node")),
        index=int(g.get("index", 0)),
        model=_s(g.get("model")),
        mig=g.get("mig", b"1") == b"1",
        healthy=g.get("healthy", b"1") == b"1",
        ver=int(g.get("ver", 0)),
        rev=int(g.get("rev", 0)),
        pos=int(g.get("pos", 0)),
        uuid=_s(g.get("uuid")),
        instances=decode_instances(g.get("inst")),
    )


def decode_job(job_id: str, h: dict[bytes, bytes]) -> JobRecord | None:
    if not h:
        return None
    g = {k.decode(): v for k, v in h.items()}
    return JobRecord(
        job_id=job_id,
        state=_s(g.get("state")),
        reason=_s(g.get("reason")),
        spec=g.get("spec") or b"",
        prio=int(float(g.get("prio", 0))),
        at=float(g.get("at", 0)),
        gpu=_s(g.get("gpu")),
        inst=_s(g.get("inst")),
        node=_s(g.get("node")),
        attempts=int(g.get("attempts", 0)),
        cancel=g.get("cancel") == b"1",
        mig_gpu=_s(g.get("mig_gpu")),
        mig_inst=_s(g.get("mig_inst")),
        traceparent=_s(g.get("tp")),
        updated=float(g.get("updated", 0)),
    )


class CancelResult(msgspec.Struct, frozen=True, kw_only=True):
    """``status``: cancelled | stop (the job is active: stop its workload on ``node``) | noop."""

    status: str
    state: str = ""
    node: str = ""
    gpu_id: str = ""
    instance_id: str = ""


class Batch:
    """Transitions queued for one pipelined round trip; ``run()`` returns one result per call."""

    def __init__(self, store: RedisState) -> None:
        self.store = store
        self.pipe = store.redis.pipeline(transaction=False)
        self._calls: list[tuple[str, Sequence[str], Sequence[Any], Any]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def _add(self, script: str, keys: Sequence[str], args: Sequence[Any], parse: Any) -> int:
        self._calls.append((script, keys, args, parse))
        return len(self._calls) - 1

    def _jk(self, job_id: str) -> Keys:
        return self.store.job_keys(job_id)

    def reserve(self, r: Reservation, now: float) -> int:
        k = self._jk(r.job_id)
        # the spec travels as its own argument: it is JSON already and is stored as it came
        args = [_ENC.encode(msgspec.structs.replace(r, spec=b"")), repr(now), r.spec]

        def parse(v: Any) -> ReserveResult:
            return ReserveResult(
                status=_s(v[0]), job_id=r.job_id, gpu_id=r.gpu_id, ver=int(v[1]), detail=_s(v[2])
            )

        return self._add("reserve", [k.gpus, k.gpu(r.gpu_id), k.job(r.job_id)], args, parse)

    def enqueue(
        self,
        job_id: str,
        spec: bytes,
        prio: int,
        submitted_at: float,
        reason: str,
        now: float,
        traceparent: str = "",
    ) -> int:
        """``traceparent``: the job's trace, so that its placement from the queue continues it."""
        k = self._jk(job_id)
        return self._add(
            "enqueue",
            [k.gpus, k.job(job_id)],
            [job_id, spec, prio, repr(submitted_at), reason, repr(now), traceparent],
            _s,
        )

    def settle(self, job_id: str, to: str, reason: str, now: float, from_states: Iterable[str]) -> int:
        """A job-only transition from one of ``from_states`` ('-' = unknown job) to ``to``; 'ok' or 'noop'."""
        k = self._jk(job_id)
        return self._add(
            "settle",
            [k.gpus, k.job(job_id)],
            [job_id, to, reason, repr(now), ",".join(from_states)],
            lambda v: _s(v[0]),
        )

    def release(self, job_id: str, kind: str, reason: str, now: float, instance_id: str = "") -> int:
        k = self._jk(job_id)

        def parse(v: Any) -> ReleaseResult:
            status = _s(v[0])
            if status != "ok" and len(v) <= 8:
                return ReleaseResult(
                    status=status, job_id=job_id, state=_s(v[1]), gpu_id=_s(v[2]), node=_s(v[3])
                )
            gpu = None
            if len(v) > 8:
                gpu = StoredGpu(
                    id=_s(v[2]),
                    node=_s(v[3]),
                    index=int(v[8]),
                    model=_s(v[7]),
                    ver=int(v[6]),
                    instances=decode_instances(v[5]),
                )
            return ReleaseResult(
                status=status,
                job_id=job_id,
                state=_s(v[1]),
                gpu_id=_s(v[2]),
                node=_s(v[3]),
                instance_id=instance_id,
                profile=_s(v[4]),
                gpu=gpu,
            )

        return self._add(
            "release",
            [k.gpus, k.job(job_id)],
            [job_id, kind, EXIT_TO_STATE[kind], reason, repr(now), instance_id],
            parse,
        )

    def mark_running(self, job_id: str, instance_id: str, now: float, cmd_id: str = "") -> int:
        k = self._jk(job_id)
        return self._add(
            "mark_running",
            [k.gpus, k.job(job_id)],
            [job_id, instance_id, repr(now), cmd_id],
            lambda v: _s(v[0]),
        )

    def fail_placement(
        self, job_id: str, reason: str, now: float, max_attempts: int, cmd_id: str = ""
    ) -> int:
        """-> (status, new state, gpu id)."""
        k = self._jk(job_id)
        return self._add(
            "fail_placement",
            [k.gpus, k.job(job_id)],
            [job_id, reason, repr(now), max_attempts, cmd_id],
            lambda v: (_s(v[0]), _s(v[1]), _s(v[2])),
        )

    def cancel(self, job_id: str, reason: str, now: float) -> int:
        k = self._jk(job_id)

        def parse(v: Any) -> CancelResult:
            st = _s(v[0])
            return CancelResult(
                status=st if st in ("cancelled", "stop") else "noop",
                state=_s(v[1]) if st == "noop" else "",
                node=_s(v[1]) if st == "stop" else "",
                gpu_id=_s(v[2]),
                instance_id=_s(v[3]),
            )

        return self._add("cancel", [k.gpus, k.job(job_id)], [job_id, reason, repr(now)], parse)

    def instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> int:
        """op: retire | drop | restore (see instance.lua) -> status."""
        k = self.store.node_keys(node)
        return self._add(
            "instance", [k.gpus, k.gpu(gpu_id)], [op, instance_id, repr(now)], lambda v: _s(v[0])
        )

    def migrate_reserve(
        self,
        job_id: str,
        src_instance: str,
        dst_gpu: str,
        dst_ver: int,
        instance: StoredInstance,
        destroy: Sequence[str],
        max_count: int,
        cooldown_s: float,
        reason: str,
        now: float,
    ) -> int:
        """-> (status, detail): ok with the target instance id, or why not."""
        k = self._jk(job_id)
        args = [
            "reserve",
            job_id,
            repr(now),
            src_instance,
            dst_gpu,
            dst_ver,
            _ENC.encode(instance),
            _ENC.encode(list(destroy)),
            max_count,
            cooldown_s,
            reason,
        ]
        return self._add("migrate", [k.gpus, k.job(job_id)], args, lambda v: (_s(v[0]), _s(v[1])))

    def migrate_finish(self, op: str, job_id: str, reason: str, now: float) -> int:
        """op: commit | abort -> (status, detail)."""
        k = self._jk(job_id)
        return self._add(
            "migrate",
            [k.gpus, k.job(job_id)],
            [op, job_id, repr(now), reason],
            lambda v: (_s(v[0]), _s(v[1])),
        )

    def track_command(self, shard: int, cmd_id: str, info: dict[str, Any]) -> int:
        self.pipe.hset(self.store.keys(shard).cmds, cmd_id, _ENC.encode(info))
        return self._add("", (), (), lambda v: v)

    async def run(self) -> list[Any]:
        """One round trip: EVALSHA for every queued call (no SCRIPT EXISTS first, unlike redis-py's pipelined
        Script); the calls Redis answers NOSCRIPT (a restarted or flushed Redis) did not run, so they are
        loaded and sent again, in their order."""
        if not self._calls:
            return []
        for name, keys, args, _ in self._calls:
            if name:
                self.pipe.evalsha(self.store.sha(name), len(keys), *keys, *args)
        raw = await self.pipe.execute(raise_on_error=False)
        missing = [n for n, v in enumerate(raw) if isinstance(v, NoScriptError)]
        if missing:
            await self.store.load_scripts()
            again = self.store.redis.pipeline(transaction=False)
            for n in missing:
                name, keys, args, _ = self._calls[n]
                again.evalsha(self.store.sha(name), len(keys), *keys, *args)
            for n, v in zip(missing, await again.execute(raise_on_error=False), strict=True):
                raw[n] = v
        out: list[Any] = []
        for (name, _, _, parse), v in zip(self._calls, raw, strict=True):
            if isinstance(v, Exception):
                raise StateError(f"{name or 'command'} failed: {v}")
            out.append(parse(v))
        return out


class RedisState:
    """The store for one namespace. ``shards`` must be the same in every process of a deployment."""

    def __init__(self, redis: aioredis.Redis, namespace: str = "", shards: int = 1) -> None:
        self.redis = redis
        self.namespace = namespace
        self.shards = shards
        self._keys = [Keys(namespace, s) for s in range(shards)]
        self._scripts: dict[str, Any] = {}

    @classmethod
    def from_settings(cls, settings: Any) -> RedisState:
        client = aioredis.from_url(settings.redis_url, decode_responses=False)
        return cls(client, settings.namespace, settings.shards)

    async def close(self) -> None:
        await self.redis.aclose()

    def sha(self, name: str) -> str:
        return str(self.script(name).sha)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every transition (at start-up, and again after Redis forgot them)."""
        for name in SCRIPTS:
            await self.redis.script_load(script_source(name))

    def script(self, name: str) -> Any:
        s = self._scripts.get(name)
        if s is None:
            s = self._scripts[name] = self.redis.register_script(script_source(name))
        return s

    def keys(self, shard: int) -> Keys:
        return self._keys[shard]

    def job_keys(self, job_id: str) -> Keys:
        return self._keys[shard_of(job_id, self.shards)]

    def node_keys(self, node: str) -> Keys:
        return self._keys[shard_of(node, self.shards)]

    def batch(self) -> Batch:
        return Batch(self)

    async def _one(self, add: Any, *args: Any) -> Any:
        b = self.batch()
        getattr(b, add)(*args)
        return (await b.run())[0]

    # --- single-transition shortcuts ------------------------------------------------------------------------
    async def reserve(self, r: Reservation, now: float) -> ReserveResult:
        return await self._one("reserve", r, now)

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
        return await self._one("enqueue", job_id, spec, prio, submitted_at, reason, now, traceparent)

    async def release(
        self, job_id: str, kind: str, reason: str, now: float, instance_id: str = ""
    ) -> ReleaseResult:
        return await self._one("release", job_id, kind, reason, now, instance_id)

    async def mark_running(self, job_id: str, instance_id: str, now: float, cmd_id: str = "") -> str:
        return await self._one("mark_running", job_id, instance_id, now, cmd_id)

    async def fail_placement(
        self, job_id: str, reason: str, now: float, max_attempts: int = 3, cmd_id: str = ""
    ) -> tuple[str, str, str]:
        return await self._one("fail_placement", job_id, reason, now, max_attempts, cmd_id)

    async def cancel(self, job_id: str, reason: str, now: float) -> CancelResult:
        return await self._one("cancel", job_id, reason, now)

    async def settle(self, job_id: str, to: str, reason: str, now: float, from_states: Iterable[str]) -> str:
        return await self._one("settle", job_id, to, reason, now, tuple(from_states))

    async def instance(self, op: str, node: str, gpu_id: str, instance_id: str, now: float) -> str:
        return await self._one("instance", op, node, gpu_id, instance_id, now)

    async def register_node(self, node: str, gpus: list[dict[str, Any]], now: float) -> dict[str, Any]:
        """gpus: [{id, index, model, mig, healthy, uuid, instances: [StoredInstance-like dicts]}] ->
        {requeued: [job ids], drift: [text], gpus: [ids]}."""
        k = self.node_keys(node)
        raw = await self.script("node")(
            [k.gpus, k.node(node)], ["register", node, repr(now), _ENC.encode(gpus)]
        )
        return _lists(msgspec.json.decode(raw))

    async def node_lost(self, node: str, now: float, reason: str) -> dict[str, Any]:
        k = self.node_keys(node)
        raw = await self.script("node")([k.gpus, k.node(node)], ["lost", node, repr(now), reason])
        return _lists(msgspec.json.decode(raw))

    async def heartbeat(self, nodes: Iterable[tuple[str, float]]) -> None:
        """Record last-seen times (not a GPU transition: a plain pipelined HSET)."""
        pipe = self.redis.pipeline(transaction=False)
        for node, at in nodes:
            pipe.hset(self.node_keys(node).node(node), "last_seen", repr(at))
        await pipe.execute()

    # --- reads ----------------------------------------------------------------------------------------------
    async def gpu_ids(self, shard: int | None = None) -> list[str]:
        shards = range(self.shards) if shard is None else (shard,)
        pipe = self.redis.pipeline(transaction=False)
        for s in shards:
            pipe.zrange(self.keys(s).gpus, 0, -1)
        return [_s(x) for ids in await pipe.execute() for x in ids]

    async def get_gpus(self, gpu_ids: Sequence[str]) -> list[StoredGpu | None]:
        """GPUs by id, one round trip. A GPU id ``node/index`` names its shard through the node."""
        pipe = self.redis.pipeline(transaction=False)
        for g in gpu_ids:
            pipe.hgetall(self.node_keys(g.rsplit("/", 1)[0]).gpu(g))
        return [decode_gpu(g, h) for g, h in zip(gpu_ids, await pipe.execute(), strict=True)]

    async def load_gpus(self, shard: int | None = None) -> list[StoredGpu]:
        """Every GPU of a shard (all shards when None), in position order: two round trips."""
        return [g for g in await self.get_gpus(await self.gpu_ids(shard)) if g is not None]

    async def snapshot(
        self, geometry: Geometry, shard: int | None = None
    ) -> tuple[ClusterSnapshot, dict[str, int]]:
        """The policies' view of the shard(s) plus each GPU's version (for compare-and-set)."""
        builder = SnapshotBuilder(geometry)
        vers: dict[str, int] = {}
        for g in await self.load_gpus(shard):
            builder.put(g.view())
            vers[g.id] = g.ver
        return builder.snapshot(), vers

    async def occupancy(self, shard: int = 0) -> bytes:
        """The shard's compact occupancy array: byte i = busy mask of the GPU at position i."""
        raw = await self.redis.get(self.keys(shard).occ)
        return raw if isinstance(raw, bytes) else b""

    async def job(self, job_id: str) -> JobRecord | None:
        raw: dict[bytes, bytes] = await self.redis.hgetall(self.job_keys(job_id).job(job_id))  # type: ignore[assignment]
        return decode_job(job_id, raw)

    async def jobs(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        pipe = self.redis.pipeline(transaction=False)
        for j in job_ids:
            pipe.hgetall(self.job_keys(j).job(j))
        return [decode_job(j, h) for j, h in zip(job_ids, await pipe.execute(), strict=True)]

    async def history(self, job_id: str) -> list[HistoryEntry]:
        raw = await self.redis.lrange(self.job_keys(job_id).hist(job_id), 0, -1)
        return [_HIST.decode(x) for x in raw]

    async def pending(self, shard: int = 0, limit: int = 256) -> list[JobRecord]:
        """The first ``limit`` pending jobs in queue order (priority, then age)."""
        ids = [_s(x) for x in await self.redis.zrange(self.keys(shard).pending, 0, limit - 1)]
        return [j for j in await self.jobs(ids) if j is not None]

    async def pending_count(self, shard: int | None = None) -> int:
        shards = range(self.shards) if shard is None else (shard,)
        return sum([int(await self.redis.zcard(self.keys(s).pending)) for s in shards])

    async def pending_ids(self, shard: int = 0, limit: int = -1) -> list[str]:
        """Queued job ids in queue order (all when ``limit`` is -1)."""
        end = -1 if limit < 0 else limit - 1
        return [_s(x) for x in await self.redis.zrange(self.keys(shard).pending, 0, end)]

    async def all_job_ids(self, shard: int) -> list[str]:
        return sorted(_s(x) for x in await self.redis.smembers(self.keys(shard).jobs))

    async def nodes(self, shard: int | None = None) -> dict[str, dict[str, str]]:
        shards = range(self.shards) if shard is None else (shard,)
        out: dict[str, dict[str, str]] = {}
        for s in shards:
            names = sorted(_s(n) for n in await self.redis.smembers(self.keys(s).nodes))
            pipe = self.redis.pipeline(transaction=False)
            for n in names:
                pipe.hgetall(self.keys(s).node(n))
            for n, h in zip(names, await pipe.execute(), strict=True):
                out[n] = {_s(k): _s(v) for k, v in h.items()}
        return out

    async def commands(self, shard: int = 0) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self.keys(shard).cmds)
        return {_s(k): msgspec.json.decode(v) for k, v in raw.items()}

    async def placing_since(self, shard: int, before: float) -> list[str]:
        """Jobs that entered placing before ``before`` and are still there."""
        return [_s(x) for x in await self.redis.zrangebyscore(self.keys(shard).placing, "-inf", before)]

    async def forget_command(self, shard: int, cmd_id: str) -> None:
        await self.redis.hdel(self.keys(shard).cmds, cmd_id)

    async def dump(self, shard: int) -> tuple[list[StoredGpu], list[JobRecord], set[str], bytes]:
        """One consistent read of a shard (one Lua script): GPUs, jobs (state and placement only), the queue,
        the
        occupancy array. For the audit of a live system, where separate reads would race the services."""
        k = self.keys(shard)
        occ, raw_gpus, pend, raw_jobs = await self.script("dump")([k.gpus], [])
        gpus = []
        for n in range(0, len(raw_gpus), 2):
            flat = raw_gpus[n + 1]
            g = decode_gpu(_s(raw_gpus[n]), dict(zip(flat[::2], flat[1::2], strict=True)))
            if g is not None:
                gpus.append(g)
        jobs = [
            JobRecord(
                job_id=_s(raw_jobs[n]),
                state=_s(raw_jobs[n + 1]),
                gpu=_s(raw_jobs[n + 2]),
                inst=_s(raw_jobs[n + 3]),
                mig_gpu=_s(raw_jobs[n + 4]),
                mig_inst=_s(raw_jobs[n + 5]),
            )
            for n in range(0, len(raw_jobs), 6)
        ]
        return gpus, jobs, {_s(p) for p in pend}, bytes(occ or b"")

    async def wipe(self) -> int:
        """Delete every key of this namespace (tests, ``migsched up --fresh``)."""
        n = 0
        for k in self._keys:
            async for key in self.redis.scan_iter(
                match=k.tag.replace("{", "\\{").replace("}", "\\}") + ":*", count=1000
            ):
                n += int(await self.redis.delete(key))
        return n


def _lists(d: dict[str, Any]) -> dict[str, Any]:
    # cjson writes an empty Lua table as {}: make the lists lists again
    return {k: (v if isinstance(v, list) else []) for k, v in d.items()}
