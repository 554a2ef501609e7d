"""``Batch``: transitions queued for one pipelined round trip (one Lua call per event awaited
singly caps a hop near 2.5-3k events/s; one pipeline per fetched batch reaches ~9.5k/s)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import msgspec
from opentelemetry import trace
from redis.exceptions import NoScriptError

from shared import telemetry
from shared.errors import Unavailable
from shared.state.codec import _ENC, CancelResult, StateError, _s, decode_instances, decode_slots, decode_stops
from shared.state.job_routes import route_shard
from shared.state.keys import Keys
from shared.state.model import (
    EXIT_TO_STATE,
    PlacementFailure,
    ReleaseResult,
    Reservation,
    ReserveResult,
    StoredGpu,
    StoredInstance,
)
from shared.state.sharding import shard_of

_tracer = telemetry.tracer("migsched.state")


class NotReplicated(StateError, Unavailable):
    """Transitions ran on the primary but too few replicas hold them yet (``MIGSCHED_REDIS_WAIT_REPLICAS``)."""


class Trips(Protocol):
    """One Redis server's round trips (``RoundTrips``) or a cluster's (``ClusterRoundTrips``)."""

    async def run(self, commands: Sequence[Sequence[Any]]) -> list[Any]: ...


class ScriptHost(Protocol):
    """What a batch needs of the store that runs it (``RedisState``): key names, loaded scripts, round trips."""

    @property
    def roundtrips(self) -> Trips: ...
    wait_replicas: int
    wait_timeout_ms: int
    shards: int

    def keys(self, shard: int) -> Keys: ...
    def job_keys(self, job_id: str) -> Keys: ...
    def job_shard(self, job_id: str) -> int: ...
    def learn_job(self, job_id: str, shard: int) -> None: ...
    def node_keys(self, node: str) -> Keys: ...
    def sha(self, name: str) -> str: ...
    async def load_scripts(self) -> None: ...


class JobKeys:
    """The keys of a call about one job, named when the batch runs: in the shard where this process knows the
    job lives (its home, unless it learnt a route), and again in another if the home answers that the job was
    routed there."""

    __slots__ = ("job_id", "of")

    def __init__(self, job_id: str, of: Callable[[Keys, str], list[str]]) -> None:
        self.job_id = job_id
        self.of = of

    def names(self, store: ScriptHost) -> list[str]:
        return self.of(store.job_keys(self.job_id), self.job_id)


def _job_script_keys(k: Keys, job_id: str) -> list[str]:
    """A job transition's keys: the shard's GPU index (the prelude derives the others from it) and the job."""
    return [k.gpus, k.job(job_id)]


class Batch:
    """Transitions queued for one pipelined round trip; ``run()`` returns one result per call."""

    def __init__(self, store: ScriptHost) -> None:
        self.store = store
        self._calls: list[tuple[str, Sequence[str] | JobKeys, Sequence[Any], Any]] = []

    def __len__(self) -> int:
        return len(self._calls)

    def _add(self, script: str, keys: Sequence[str] | JobKeys, args: Sequence[Any], parse: Any) -> int:
        self._calls.append((script, keys, args, parse))
        return len(self._calls) - 1

    def route(self, job_id: str, shard: int, now: float) -> int:
        """Send a new job to ``shard`` (``lua/route.lua``, in its home shard) -> the shard it lives in, -1 for
        its home. ``RedisState.route`` is the caller."""
        home = self.store.keys(shard_of(job_id, self.store.shards))
        return self._add("route", [home.gpus], [job_id, shard, repr(now)], int)

    def reserve(self, r: Reservation, now: float) -> int:
        # the spec travels as its own argument: it is JSON already and is stored as it came
        args = [_ENC.encode(msgspec.structs.replace(r, spec=b"")), repr(now), r.spec]

        def parse(v: Any) -> ReserveResult:
            return ReserveResult(
                status=_s(v[0]), job_id=r.job_id, gpu_id=r.gpu_id, ver=int(v[1]), detail=_s(v[2]),
                master_addr=_s(v[3]) if len(v) > 3 else "",
            )

        keys = JobKeys(r.job_id, lambda k, j: [k.gpus, k.gpu(r.gpu_id), k.job(j)])
        return self._add("reserve", keys, args, parse)

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
        return self._add(
            "enqueue",
            JobKeys(job_id, _job_script_keys),
            [job_id, spec, prio, repr(submitted_at), reason, repr(now), traceparent],
            _s,
        )

    def settle(self, job_id: str, to: str, reason: str, now: float, from_states: Iterable[str],
               spec: bytes = b"") -> int:
        """A job-only transition from one of ``from_states`` ('-' = unknown job) to ``to``; 'ok' or 'noop'.
        ``spec``: the job's submit, kept when the job was unknown (a job rejected on arrival)."""
        return self._add(
            "settle",
            JobKeys(job_id, _job_script_keys),
            [job_id, to, reason, repr(now), ",".join(from_states), spec],
            lambda v: _s(v[0]),
        )

    def release(
        self, job_id: str, kind: str, reason: str, now: float, instance_id: str = "", node: str = "",
        attempt: int | None = None, report: str = "",
    ) -> int:
        """``instance_id``: the instance the exit names ('' = any); ``node``: the node that reported it ('' =
        any); ``attempt``: that of the place command that started the run (None: unknown). An exit that names no
        instance, from a node where the job holds nothing, is stale; so is one of a run an earlier attempt
        started (that placement is gone, whatever instance the job holds now). ``report``: the exit report's id,
        kept with the release: once released, only that report (redelivered) gets the GPU back (``noop``)."""

        def parse(v: Any) -> ReleaseResult:
            status = _s(v[0])
            if status == "member":  # one node of a gang across nodes completed its part: its slots freed
                return ReleaseResult(status=status, job_id=job_id, state=_s(v[1]), gpu_id=_s(v[2]),
                                     node=_s(v[3]), instance_id=instance_id, slots=decode_slots(v[5]))
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
                slots=decode_slots(v[9]) if len(v) > 9 else (),
                stop=(_s(v[10]), _s(v[11]), _s(v[12])) if len(v) > 12 and _s(v[10]) else None,
                given_back=_s(v[13]) if len(v) > 13 else "",
                stops=decode_stops(v[14]) if len(v) > 14 else (),
            )

        return self._add(
            "release",
            JobKeys(job_id, _job_script_keys),
            [job_id, kind, EXIT_TO_STATE[kind], reason, repr(now), instance_id, node,
             "" if attempt is None else str(attempt), report],
            parse,
        )

    def mark_running(
        self,
        job_id: str,
        instance_id: str,
        now: float,
        cmd_id: str = "",
        attempt: int | None = None,
        node: str = "",
        found: StoredInstance | None = None,
    ) -> int:
        """-> ok | noop | stale | gone | stop. ``attempt``: the place command's (None: unknown); ``node`` and
        ``found`` (the instance the node reports): where a run the state no longer expects is held, 'stop'
        (``lua/mark_running.lua``)."""
        return self._add(
            "mark_running",
            JobKeys(job_id, _job_script_keys),
            [
                job_id,
                instance_id,
                repr(now),
                cmd_id,
                "" if attempt is None else attempt,
                node,
                _ENC.encode(found) if found is not None else "",
            ],
            lambda v: _s(v[0]),
        )

    def fail_placement(
        self,
        job_id: str,
        reason: str,
        now: float,
        max_attempts: int,
        cmd_id: str = "",
        attempt: int | None = None,
    ) -> int:
        """-> (status, new state, the GPU id freed: several comma-separated for a gang). A command of an older
        ``attempt`` than the job's is a no-op."""
        return self._add(
            "fail_placement",
            JobKeys(job_id, _job_script_keys),
            [job_id, reason, repr(now), max_attempts, cmd_id, "" if attempt is None else attempt],
            lambda v: PlacementFailure(_s(v[0]), _s(v[1]), _s(v[2]), decode_stops(v[3]) if len(v) > 3 else ()),
        )

    def cancel(self, job_id: str, reason: str, now: float) -> int:

        def parse(v: Any) -> CancelResult:
            st = _s(v[0])
            return CancelResult(
                status=st if st in ("cancelled", "stop") else "noop",
                state=_s(v[1]) if st == "noop" else "",
                node=_s(v[1]) if st == "stop" else "",
                gpu_id=_s(v[2]),
                instance_id=_s(v[3]),
            )

        return self._add("cancel", JobKeys(job_id, _job_script_keys), [job_id, reason, repr(now)], parse)

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
        return self._add("migrate", JobKeys(job_id, _job_script_keys), args, lambda v: (_s(v[0]), _s(v[1])))

    def migrate_finish(
        self, op: str, job_id: str, reason: str, now: float, gone: str = "destroy", node: str = "",
        target: str = "",
    ) -> int:
        """op: commit | abort -> (status, detail). An abort gives back the idle instances the reserve removed
        from the target's way: ``gone`` 'idle' (the move's command never went out) restores them idle, else
        they are kept retiring and the detail names them (``gpu|id,id``: send each a destroy_idle). For a job
        no longer migrating, ``node`` and ``target`` (the target id's tail ``:<job>.<nonce>``) name a target a
        release kept retiring for a stop there: the abort drops it (see ``lua/migrate.lua``)."""
        return self._add(
            "migrate",
            JobKeys(job_id, _job_script_keys),
            [op, job_id, repr(now), reason, gone, node, target],
            lambda v: (_s(v[0]), _s(v[1])),
        )

    def expire(self, shard: int, before: float, limit: int, cap: int = 0, settled: float = 0.0) -> int:
        """Forget at most ``limit`` ended jobs of ``shard``, the oldest first (hash, history, set memberships):
        those that ended before ``before`` and, while the shard lists more than ``cap`` ended jobs (0: no cap),
        the oldest beyond the cap that ended before ``settled`` -> how many (``lua/expire.lua``)."""
        args: list[Any] = [repr(before), limit, cap, repr(settled)]
        return self._add("expire", [self.store.keys(shard).gpus], args, int)

    def track_command(self, shard: int, cmd_id: str, info: dict[str, Any]) -> int:
        # queued in call order with the scripts (run() sends them in order), or the results would not line up
        return self._add("", [self.store.keys(shard).cmds], [cmd_id, _ENC.encode(info)], lambda v: v)

    def commands(self) -> list[tuple[Any, ...]]:
        """The Redis commands ``run()`` sends, in call order."""
        return [self._command(call) for call in self._calls]

    async def _trip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """One round trip; with ``wait_replicas``, a ``WAIT`` rides at its end (the same write, the same
        connection, so it covers exactly these transitions) and too few replicas is an outage: the caller
        retries (the transitions are idempotent) rather than act on a write a failover could lose."""
        n = self.store.wait_replicas
        if not n:
            return await self.store.roundtrips.run(commands)
        raw = await self.store.roundtrips.run([*commands, ("WAIT", n, self.store.wait_timeout_ms)])
        acked = raw.pop()
        if isinstance(acked, Exception) or int(acked) < n:
            raise NotReplicated(f"{len(commands)} transition(s) reached {acked} of the {n} replica(s) asked for "
                                f"within {self.store.wait_timeout_ms} ms")
        return raw

    async def _again(self, calls: list[int], raw: list[Any]) -> None:
        for n, v in zip(calls, await self._trip([self._command(self._calls[n]) for n in calls]), strict=True):
            raw[n] = v

    def _routed(self, raw: list[Any]) -> list[int]:
        """The calls that reached a job's home after the job was routed to another shard (the prelude's
        answer ``['routed', '<shard>:<at>']``): each job's shard is learnt, and the calls to send again are
        returned. A reservation is not sent again, since its GPUs were chosen in the wrong shard: it comes back
        lost (status 'routed'), and the balancer decides again on the right shard."""
        again = []
        for n, v in enumerate(raw):
            if not (isinstance(v, list) and len(v) == 2 and _s(v[0]) == "routed"):
                continue
            name, keys, _, _ = self._calls[n]
            if not isinstance(keys, JobKeys):
                continue
            home = shard_of(keys.job_id, self.store.shards)
            self.store.learn_job(keys.job_id, route_shard(_s(v[1]), self.store.shards, home))
            if name == "reserve":
                raw[n] = ["routed", 0, f"the job lives in shard {self.store.job_shard(keys.job_id)}"]
            else:
                again.append(n)
        return again

    def _command(self, call: tuple[str, Sequence[str] | JobKeys, Sequence[Any], Any]) -> tuple[Any, ...]:
        name, named, args, _ = call
        keys = named.names(self.store) if isinstance(named, JobKeys) else named
        if name:
            return ("EVALSHA", self.store.sha(name), len(keys), *keys, *args)
        return ("HSET", keys[0], args[0], args[1])  # track_command

    async def run(self) -> list[Any]:
        """One round trip: EVALSHA for every queued call (no SCRIPT EXISTS first, unlike redis-py's pipelined
        Script); the calls Redis answers NOSCRIPT (a restarted or flushed Redis) did not run, so they are
        loaded and sent again, in their order. Under a recording span it is that span's child."""
        if not self._calls:
            return []
        if telemetry.recording() and trace.get_current_span().is_recording():
            scripts = Counter(name or "track_command" for name, *_ in self._calls)
            with _tracer.start_as_current_span(
                "redis " + " ".join(f"{n}x{c}" for n, c in sorted(scripts.items())), kind=trace.SpanKind.CLIENT,
                attributes={"db.system": "redis", "db.operation.name": "EVALSHA",
                            "migsched.transitions": len(self._calls)},
            ):
                return await self._run()
        return await self._run()

    async def _run(self) -> list[Any]:
        raw = await self._trip(self.commands())
        missing = [n for n, v in enumerate(raw) if isinstance(v, NoScriptError)]
        if missing:
            await self.store.load_scripts()
            await self._again(missing, raw)
        routed = self._routed(raw)
        if routed:  # sent to the job's home, which routed it elsewhere: now learnt, sent there once more
            await self._again(routed, raw)
        out: list[Any] = []
        for (name, _, _, parse), v in zip(self._calls, raw, strict=True):
            if isinstance(v, Exception):
                raise StateError(f"{name or 'command'} failed: {v}") from v
            out.append(parse(v))
        return out
