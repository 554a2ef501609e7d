"""The event bus on NATS JetStream: one connection for one namespace, its streams, publishing and pull consumers.

Publishing always sets ``Nats-Msg-Id`` (the message's ``id``) so that a republish after a crash is dropped by the
stream's duplicate window, and injects the W3C ``traceparent`` of the given (or current) OpenTelemetry context so
that one job is one trace across hops. Consumers are ``shared.bus.consumer.Consumer`` over a ``Puller``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from opentelemetry import context as otel_context

from shared import access, telemetry
from shared.bus.consumer import Consumer, Handler
from shared.bus.elections import Elections
from shared.bus.errors import BusError, SubscriptionClosed
from shared.bus.health import BusHealth
from shared.bus.outgoing import Outgoing, count_published
from shared.bus.publish_acks import PublishAcks, reply_decoder
from shared.bus.puller import Puller
from shared.bus.server_version import replication_warning
from shared.bus.transport import ConsumerLead, ConsumerSpec, StoredMessage
from shared.events import Subjects, encode
from shared.settings import Settings

log = logging.getLogger("migsched.bus")
STREAM_SETUP_S = 60.0
"""How long a service waits at start for JetStream to set its streams up (a cluster electing leaders)."""


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise BusError(f"cannot read the NATS password file {path}: {exc}") from exc


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


class JetStreamBus:
    """The ``EventBus`` of one namespace on NATS JetStream. Create with ``await JetStreamBus.connect(settings)``."""

    def __init__(self, nc: NATS, settings: Settings, health: BusHealth | None = None) -> None:
        self.nc = nc
        self.health = health or BusHealth(connected=nc.is_connected)
        self.js: JetStreamContext = nc.jetstream(publish_async_max_pending=8192)
        self.acks = PublishAcks(nc)
        self.elections = Elections(nc)
        self.settings = settings
        self.subjects = Subjects(settings.namespace)

    @classmethod
    async def connect(cls, settings: Settings, name: str = "migsched", give_up_s: float | None = None,
                      **options: Any) -> JetStreamBus:
        """Connect, retrying until a server answers: a service waits for NATS to come up. ``give_up_s``: a
        command-line client's limit instead (``BusError`` naming the servers and the last error)."""
        servers = [s.strip() for s in settings.nats_url.split(",") if s.strip()]
        health = BusHealth()
        user = unquote(urlsplit(servers[0]).username or "") if servers else ""
        if user and "inbox_prefix" not in options:  # replies only on the user's own inboxes (shared.access)
            options["inbox_prefix"] = access.inbox_prefix(user)
        if user and settings.nats_password_file:  # the password from a file (a mounted Secret), not the URL
            options["user"], options["password"] = user, _read_secret(settings.nats_password_file)
            servers = [_without_userinfo(s) for s in servers]
        nc = NATS()
        fixed: dict[str, Any] = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.5,  # typed int, takes float
                                 "pending_size": 64 * 1024 * 1024}
        connecting = nc.connect(servers=servers, name=name, **fixed, **health.options(dict(options)))
        try:
            await (connecting if give_up_s is None else asyncio.wait_for(connecting, give_up_s))
        except TimeoutError:
            with contextlib.suppress(Exception):
                await nc.close()
            shown = ", ".join(_without_userinfo(s) for s in servers)
            raise BusError(f"cannot reach NATS at {shown} within {give_up_s:g} s: {health.last_error}") from None
        return cls(nc, settings, health)

    async def close(self) -> None:
        if not self.nc.is_closed:
            # nothing more can be sent on a broken connection: closing is all that is left
            with contextlib.suppress(Exception):
                await self.nc.flush(timeout=2)
            await self.nc.close()

    # --- streams --------------------------------------------------------------------------------------------
    async def ensure_streams(self) -> None:
        """Create or update the five streams, one per concern (idempotent; every service calls it)."""
        st = self.settings
        if why := self.replication_warning():
            log.warning("%s", why)
        storage = api.StorageType.FILE if st.stream_storage == "file" else api.StorageType.MEMORY
        for name, subjects in self.subjects.streams().items():
            cfg = api.StreamConfig(
                name=name,
                subjects=subjects,
                retention=api.RetentionPolicy.LIMITS,
                storage=storage,
                num_replicas=st.stream_replicas,
                max_age=st.stream_max_age_s,
                duplicate_window=min(st.duplicate_window_s, st.stream_max_age_s),
                discard=api.DiscardPolicy.OLD,
            )
            await self._retrying(f"setting up stream {name}", functools.partial(self._ensure_stream, name, cfg))

    def replication_warning(self) -> str | None:
        """Why the connected server is unsafe for this namespace's replicated streams, if it is."""
        v = self.nc.connected_server_version
        try:
            version = f"{v.major}.{v.minor}.{v.patch}"
        except ValueError:  # not a semantic version: said as it is
            version = repr(v)
        return replication_warning(version, self.settings.stream_replicas)

    async def _stream_exists(self, name: str) -> bool:
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            return False
        return True

    async def _ensure_stream(self, name: str, cfg: api.StreamConfig) -> None:
        if not await self._stream_exists(name):
            try:
                await self.js.add_stream(cfg)
            except BadRequestError as exc:
                # another service won the race: the server answers "already in use" or, for a create racing
                # the same create, "subjects overlap with an existing stream"; either way the stream is there now
                if "already in use" in str(exc).lower() or await self._stream_exists(name):
                    return
                raise BusError(f"cannot create stream {name}: {exc}") from exc
            return
        try:
            await self.js.update_stream(cfg)
        except BadRequestError as exc:  # e.g. storage type cannot change: keep the existing stream
            log.warning("stream %s kept as it is: %s", name, exc)

    @staticmethod
    async def _retrying(what: str, op: Callable[[], Awaitable[None]]) -> None:
        """``op`` again while the JetStream API is only busy: on a cluster, a replicated stream's creation
        waits for its peers (several services creating the streams at once, a leader election after a
        server loss) and can outlast one request's timeout. Up to ``STREAM_SETUP_S`` in all."""
        deadline = asyncio.get_running_loop().time() + STREAM_SETUP_S
        delay = 0.2
        while True:
            try:
                await op()
                return
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, ServiceUnavailableError) as exc:
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise BusError(f"{what}: JetStream did not answer within {STREAM_SETUP_S:.0f} s") from exc
                log.warning("%s: JetStream busy (%r); trying again in %.1f s", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)

    async def delete_streams(self) -> None:
        """Remove this namespace's streams (tests and ``migsched up --fresh``)."""
        for name in self.subjects.streams():
            await self._retrying(f"deleting stream {name}", functools.partial(self._delete_stream, name))

    async def _delete_stream(self, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self.js.delete_stream(name)

    # --- publishing -----------------------------------------------------------------------------------------
    @staticmethod
    def _headers(
        msg_id: str, ctx: otel_context.Context | None, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        headers: dict[str, str] = {"Nats-Msg-Id": msg_id}
        telemetry.inject(headers, ctx)
        if extra:
            headers.update(extra)
        return headers

    async def publish(
        self,
        subject: str,
        msg: msgspec.Struct,
        *,
        ctx: otel_context.Context | None = None,
        msg_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> api.PubAck:
        """Publish and wait for the stream's acknowledgement (``ack.duplicate`` is True for a replay)."""
        mid = msg_id or msg.id  # type: ignore[attr-defined]
        try:
            ack = await self.js.publish(subject, encode(msg), headers=self._headers(mid, ctx, headers))
        except nats.errors.Error as exc:
            raise BusError(f"publish to {subject} failed: {exc!r}") from exc
        count_published((msg,))
        return ack

    async def publish_batch(self, items: Sequence[Outgoing]) -> list[api.PubAck]:
        """Publish many without waiting for each acknowledgement in turn (several times the rate of one by one);
        every acknowledgement must come within ``publish_timeout_s`` or the batch fails (``BusError``: the
        caller's handler fails and its messages come back; the ids make a republish a no-op)."""
        if not items:
            return []
        futures: list[asyncio.Future[api.PubAck]] = []
        try:
            for it in items:
                mid = it.msg_id or it.msg.id  # type: ignore[attr-defined]
                futures.append(await self.acks.publish(it.subject, encode(it.msg), self._headers(mid, it.ctx, None)))
        except nats.errors.Error as exc:
            self.acks.forget(futures)
            raise BusError(f"batch publish failed: {exc!r}") from exc
        limit = self.settings.publish_timeout_s
        _, pending = await asyncio.wait(futures, timeout=limit)
        if pending:
            self.acks.forget(futures)
            raise BusError(f"{len(pending)} of {len(futures)} publishes not acknowledged within {limit} s")
        errors = [e for e in (f.exception() for f in futures) if e is not None]  # each retrieved: no stray logs
        if errors:
            raise errors[0]
        count_published(it.msg for it in items)
        return [f.result() for f in futures]

    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> api.PubAck:
        """Publish bytes as they are (dead letters, replays): the headers are the caller's, dedupe id included."""
        try:
            return await self.js.publish(subject, data, headers=headers)
        except nats.errors.Error as exc:
            raise BusError(f"publish to {subject} failed: {exc!r}") from exc

    # --- consumers ------------------------------------------------------------------------------------------
    def consumer(self, stream: str, durable: str, subject: str, handler: Handler, **options: Any) -> Consumer:
        """A consumer of ``subject`` on ``stream`` (see ``shared.bus.consumer.Consumer`` for the options)."""
        return Consumer(self, stream, durable, subject, handler, **options)

    def command_consumer(self, node: str, handler: Handler, **options: Any) -> Consumer:
        """The durable consumer of ``cmd.<node>`` for one executor (one per node)."""
        return self.consumer(self.subjects.stream_cmd, f"executor-{node}", self.subjects.cmd(node), handler,
                             **options)

    async def subscribe(self, spec: ConsumerSpec) -> PullSubscription:
        """Create (or keep) the JetStream consumer of ``spec`` and bind a pull subscription to it."""
        cfg = api.ConsumerConfig(
            durable_name=spec.name,
            filter_subject=spec.subject,
            ack_policy=api.AckPolicy.EXPLICIT if spec.acks else api.AckPolicy.NONE,
            max_deliver=spec.max_deliver,
            ack_wait=spec.ack_wait_s,
            max_ack_pending=20000,
            deliver_policy=api.DeliverPolicy.NEW if spec.deliver_new else api.DeliverPolicy.ALL,
            max_waiting=64,
        )
        if spec.ephemeral:
            cfg.durable_name = None
            cfg.name = spec.name
            cfg.inactive_threshold = 30.0
        # as the streams: on a cluster under load the API may outlast one request's timeout (a service that gave
        # up here would exit at start-up)
        await self._retrying(f"setting up consumer {spec.name}", lambda: self._ensure_consumer(spec, cfg))
        puller = Puller(self.nc, spec.stream, spec.name, spec.batch,
                        expires_s=max(1.0, min(30.0, spec.fetch_timeout_s * 100)), linger_s=spec.linger_s)
        await puller.start()
        return PullSubscription(puller)

    async def _ensure_consumer(self, spec: ConsumerSpec, cfg: api.ConsumerConfig) -> None:
        if spec.ephemeral:
            await self.js.add_consumer(spec.stream, cfg)  # the same config again is accepted (idempotent)
            return
        try:
            await self.js.consumer_info(spec.stream, spec.name)
        except NotFoundError:
            try:
                await self.js.add_consumer(spec.stream, cfg)
            except BadRequestError as exc:  # created concurrently by a replica
                log.debug("consumer %s: %s", spec.name, exc)

    async def delete_consumer(self, stream: str, durable: str) -> None:
        """Remove a durable consumer (one an older version left). Asked directly of the API, so that a user
        granted exactly that subject may do it."""
        reply = await self.nc.request(f"$JS.API.CONSUMER.DELETE.{stream}.{durable}", b"", timeout=2.0)
        error = reply_decoder.decode(reply.data).error if reply.data else None
        if error and error.get("code") != 404:
            raise BusError(f"cannot delete consumer {durable} on {stream}: {error}")

    async def consumer_lead(self, stream: str, durable: str) -> ConsumerLead | None:
        """The consumer's leader and delivered sequence; None when there is no such consumer."""
        try:
            info = await self.js.consumer_info(stream, durable)
        except NotFoundError:
            return None
        except nats.errors.Error as exc:
            raise BusError(f"consumer info of {durable} on {stream} failed: {exc!r}") from exc
        cluster = info.cluster
        leader = ""
        if cluster is not None and cluster.leader and cluster.leader_since is not None:
            leader = f"{cluster.leader}@{cluster.leader_since.isoformat()}"
        elif cluster is not None and cluster.leader:  # no since-when: which election, from the advisories
            leader = f"{cluster.leader}#{await self.elections.count(stream, durable)}"
        elif cluster is None or not cluster.name:  # one server, no cluster: its leader never changes
            leader = "standalone"
        return ConsumerLead(leader, int(info.delivered.stream_seq))

    async def stored(self, stream: str, subject: str, since: float, up_to_seq: int,
                     limit: int) -> list[StoredMessage]:
        """The messages of ``subject`` the stream stored from ``since`` on (seconds since the epoch), up to stream
        sequence ``up_to_seq`` and at most ``limit``, read through a consumer of its own that nothing acks and
        the server drops soon after (the same API subjects as the service's own consumers)."""
        name = f"scan-{uuid.uuid4().hex[:12]}"
        cfg = api.ConsumerConfig(
            name=name, filter_subject=subject, ack_policy=api.AckPolicy.NONE,
            deliver_policy=api.DeliverPolicy.BY_START_TIME,
            opt_start_time=datetime.datetime.fromtimestamp(since, datetime.UTC),
            inactive_threshold=10.0, max_waiting=4,
        )
        try:
            await self.js.add_consumer(stream, cfg)
        except nats.errors.Error as exc:
            raise BusError(f"cannot read {subject} on {stream}: {exc!r}") from exc
        puller = Puller(self.nc, stream, name, min(256, max(1, limit)), expires_s=1.0)
        await puller.start()
        try:
            return await puller.read_stored(up_to_seq, limit)
        finally:
            await puller.stop()


class JetStreamMessage:
    """A JetStream message as the consumer loop reads it."""

    __slots__ = ("msg",)

    def __init__(self, msg: Msg) -> None:
        self.msg = msg

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self.msg.headers

    @property
    def deliveries(self) -> int:
        """How many times JetStream has delivered it, read straight from its ack subject
        (``$JS.ACK.<stream>.<consumer>.<delivered>...``, or with domain and account hash in front): the full
        metadata parse costs more than a small handler does per message."""
        tokens = (self.msg.reply or "").split(".")
        if len(tokens) == 9:
            return int(tokens[4])
        if len(tokens) >= 11:
            return int(tokens[6])
        return int(self.msg.metadata.num_delivered)

    @property
    def stream_seq(self) -> int:
        return int(self.msg.metadata.sequence.stream)

    async def ack(self) -> None:
        await self.msg.ack()

    async def nak(self, delay: float) -> None:
        await self.msg.nak(delay=delay)


class PullSubscription:
    __slots__ = ("puller",)

    def __init__(self, puller: Puller) -> None:
        self.puller = puller

    async def next_batch(self, timeout: float) -> list[JetStreamMessage]:
        try:
            return [JetStreamMessage(m) for m in await self.puller.next_batch(timeout)]
        except nats.errors.ConnectionClosedError as exc:
            raise SubscriptionClosed(str(exc)) from exc

    async def stop(self) -> None:
        await self.puller.stop()
