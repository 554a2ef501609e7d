"""A small Python client for programs that submit work to migsched: ``submit``, ``cancel``, ``wait``.

    async with MigschedClient("nats://127.0.0.1:4222", redis_url="redis://127.0.0.1:6379/0") as c:
        job = await c.submit(profile="3g.20gb", tenant="team-a", duration_s=600)
        state = await c.wait(job, timeout=3600)          # "finished", "failed", "cancelled" or "rejected"

It speaks the public contract only: it publishes ``JobSubmit``/``JobCancel`` on
``jobs.submit``/``jobs.cancel``
and learns outcomes from ``jobs.exit`` (and from the state store when ``redis_url`` is given, which also sees
states that have no message of their own, such as ``running`` or ``rejected``). Any other language can do the
same with plain NATS and JSON (``migsched schema`` prints the schemas).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
from nats.js.errors import NotFoundError
from opentelemetry import trace

from shared import telemetry
from shared.bus import JetStreamBus, Outgoing
from shared.bus.errors import BusError
from shared.errors import MigschedError
from shared.events import JobCancel, JobExit, JobSubmit, Topology, Workload, check_demand, decode, new_id, now
from shared.policy.request import Demand
from shared.settings import Settings, load
from shared.state.model import EXIT_TO_STATE, TERMINAL_STATES

_tracer = telemetry.tracer("migsched.client")


class ClientError(MigschedError):
    """The request is malformed, or the outcome cannot be learnt (e.g. ``wait`` timed out)."""


def _checked(msg: JobSubmit) -> JobSubmit:
    """``msg`` if it satisfies the schema's bounds, which building a Struct does not check and decoding does."""
    try:
        return msgspec.json.decode(msgspec.json.encode(msg), type=JobSubmit)
    except msgspec.ValidationError as exc:
        raise ClientError(f"invalid job {msg.job_id!r}: {exc}") from None


class WaitTimeout(ClientError, TimeoutError):
    """``wait`` gave up before the job reached one of the states asked for."""


def demand_of(
    *,
    profile: str | None = None,
    compute_slices: int | None = None,
    memory_gb: float | None = None,
    gpus: int | None = None,
    shared: bool = False,
) -> Demand:
    """One of: a MIG profile (name or shape), compute slices + memory GB, N whole GPUs, or a time-sliced
    share."""
    chosen = sum(
        x
        for x in (
            profile is not None,
            compute_slices is not None or memory_gb is not None,
            gpus is not None,
            shared,
        )
    )
    if chosen != 1:
        raise ClientError("give exactly one of: profile, compute_slices + memory_gb, gpus, shared")
    if shared:
        d = Demand(kind="shared")
    elif gpus is not None:
        d = Demand(kind="gpus", gpus=gpus)
    elif profile is not None:
        d = Demand(kind="mig", profile=profile)
    else:
        d = Demand(kind="mig", compute_slices=compute_slices, memory_gb=memory_gb)
    try:
        check_demand(d)
    except MigschedError as exc:
        raise ClientError(str(exc)) from None
    return d


class MigschedClient:
    """Connect with ``await c.connect()`` or ``async with``. One client may be shared by many tasks. ``connect``
    fails (``ClientError``) when no NATS server answers within ``MIGSCHED_CONNECT_GIVE_UP_S``."""

    def __init__(
        self,
        nats_url: str | None = None,
        *,
        namespace: str | None = None,
        redis_url: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        base = settings or load(Settings)
        overrides: dict[str, Any] = {}
        if nats_url is not None:
            overrides["nats_url"] = nats_url
        if namespace is not None:
            overrides["namespace"] = namespace
        if redis_url is not None:
            overrides["redis_url"] = redis_url
        self.settings = load(type(base), env={}, **{**_fields(base), **overrides})
        self._use_redis = redis_url is not None
        self.bus: JetStreamBus | None = None
        self._state: Any = None

    async def connect(self) -> MigschedClient:
        try:
            self.bus = await JetStreamBus.connect(self.settings, name="migsched-client",
                                                  give_up_s=self.settings.connect_give_up_s or None)
        except BusError as exc:
            raise ClientError(str(exc)) from None
        try:  # the stack creates its streams; a client that comes first creates them with the same layout
            await self.bus.js.stream_info(self.bus.subjects.stream_jobs)
        except NotFoundError:
            await self.bus.ensure_streams()
        if self._use_redis:
            from shared.state import RedisState
            from shared.state.deployment import open_reader

            # read with the count the services recorded: another would miss jobs
            self._state = await open_reader(RedisState, self.settings, default=self.settings.shards)
        return self

    async def close(self) -> None:
        if self._state is not None:
            await self._state.close()
        if self.bus is not None:
            await self.bus.close()

    async def __aenter__(self) -> MigschedClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _bus(self) -> JetStreamBus:
        if self.bus is None:
            raise ClientError("the client is not connected (use `async with` or `await client.connect()`)")
        return self.bus

    # --- publishing -----------------------------------------------------------------------------------------
    @staticmethod
    def job(
        *,
        job_id: str | None = None,
        demand: Demand | None = None,
        tenant: str = "default",
        priority: int = 0,
        duration_s: float | None = None,
        latency_sensitive: bool = False,
        migratable: bool = True,
        patience_s: float | None = None,
        argv: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        priority_class: str | None = None,
        submitted_at: float | None = None,
        topology: Topology | None = None,
        launch: Literal["per-gpu", "per-node"] | None = None,
        run_as: str | None = None,
        **kind: Any,
    ) -> JobSubmit:
        """A ``JobSubmit``; ``kind`` is ``profile=``, ``compute_slices=`` + ``memory_gb=``, ``gpus=`` or
        ``shared=True`` when no ``demand`` is given; ``topology`` and ``launch`` for a gang. Checked against the
        published schema here: a job the services would dead-letter is refused with the field that is wrong."""
        jid = job_id or new_id("job")
        return _checked(JobSubmit(
            id=f"submit-{jid}",
            job_id=jid,
            tenant=tenant,
            priority=priority,
            priority_class=priority_class,
            demand=demand if demand is not None else demand_of(**kind),
            latency_sensitive=latency_sensitive,
            migratable=migratable,
            duration_hint_s=duration_s,
            patience_s=patience_s,
            workload=Workload(argv=tuple(argv), env=dict(env or {}), run_as=run_as, launch=launch),
            labels=dict(labels or {}),
            submitted_at=submitted_at if submitted_at is not None else now(),
            topology=topology,
        ))

    async def submit(self, **job: Any) -> str:
        """Publish one job (see ``job``); returns its id once JetStream has stored it."""
        msg = self.job(**job)
        with _tracer.start_as_current_span(
            "submit", context=telemetry.publisher_context(), kind=trace.SpanKind.PRODUCER,
            attributes={"migsched.job_id": msg.job_id},
        ):
            await self._bus().publish(self._bus().subjects.jobs_submit, msg)
        return msg.job_id

    async def submit_many(self, jobs: Iterable[JobSubmit]) -> list[str]:
        """Publish many jobs without waiting for each acknowledgement in turn (replay, load generation)."""
        bus = self._bus()
        items, ids = [], []
        for msg in jobs:
            span = _tracer.start_span(
                "submit", context=telemetry.publisher_context(), kind=trace.SpanKind.PRODUCER,
                attributes={"migsched.job_id": msg.job_id},
            )
            items.append(Outgoing(bus.subjects.jobs_submit, msg, trace.set_span_in_context(span)))
            ids.append(msg.job_id)
            span.end()
        await bus.publish_batch(items)
        return ids

    async def cancel(self, job_id: str, reason: str = "cancelled by the user") -> None:
        bus = self._bus()
        await bus.publish(
            bus.subjects.jobs_cancel, JobCancel(id=new_id("cancel"), job_id=job_id, reason=reason, at=now())
        )

    async def consumed(self, tries: int = 4, pause_s: float = 0.25) -> bool:
        """Whether a running service takes this namespace's submits: a consumer of ``jobs.submit`` with a pull
        request waiting (a balancer always keeps one open; a durable left by a stopped one has none)."""
        bus = self._bus()
        wanted = bus.subjects.jobs_submit
        for attempt in range(tries):
            try:
                infos = await bus.js.consumers_info(bus.subjects.stream_jobs)
            except NotFoundError:
                return False
            for ci in infos:
                subjects = {ci.config.filter_subject, *(ci.config.filter_subjects or ())}
                if wanted in subjects and (ci.num_waiting or 0) > 0:
                    return True
            if attempt + 1 < tries:  # a pull request is renewed as it expires: look again a moment later
                await asyncio.sleep(pause_s)
        return False

    async def record(self, job_id: str) -> Any:
        """The job's record in the state store (``JobRecord``: state, reason, history), or None."""
        return None if self._state is None else await self._state.job(job_id)

    # --- outcomes -------------------------------------------------------------------------------------------
    async def state(self, job_id: str) -> str | None:
        """The job's current state from the state store (``None``: unknown there, or no ``redis_url``)."""
        if self._state is None:
            return None
        rec = await self._state.job(job_id)
        return None if rec is None else str(rec.state)

    async def wait(
        self,
        job_id: str,
        states: Iterable[str] = TERMINAL_STATES,
        timeout: float | None = None,
        poll_s: float = 0.25,
    ) -> str:
        """Wait until the job is in one of ``states``; returns that state. Raises ``WaitTimeout``.

        Exits arrive on ``jobs.exit``; with a state store the current state is also checked first and then
        polled (states such as ``running`` or ``rejected`` have no message on the public subjects).
        """
        wanted = frozenset(states)
        bus = self._bus()
        found: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def on_exit(m: Any) -> None:
            with contextlib.suppress(MigschedError):
                ex = decode(m.subject, m.data, bus.subjects)
                if isinstance(ex, JobExit) and ex.job_id == job_id:
                    st = EXIT_TO_STATE.get(ex.kind, ex.kind)
                    if st in wanted and not found.done():
                        found.set_result(st)

        sub: Any
        if self._state is None:  # no store: read the exits from the stream's start, so none is missed
            sub = await bus.js.subscribe(bus.subjects.jobs_exit, cb=on_exit, ordered_consumer=True)
        else:
            sub = await bus.nc.subscribe(bus.subjects.jobs_exit, cb=on_exit)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not found.done():
                st = await self.state(job_id)
                if st in wanted:
                    return str(st)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(
                        f"job {job_id} did not reach {sorted(wanted)} within {timeout}s "
                        f"(last state: {st or 'unknown'})"
                    )
                step = poll_s if self._state is not None else None
                if left is not None:
                    step = left if step is None else min(step, left)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(found), step)
            return found.result()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def _fields(settings: Settings) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
