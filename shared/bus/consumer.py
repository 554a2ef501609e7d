"""The consumer loop every transport shares: fetch a batch, decode, hand it to a handler, settle; dead-letter poison.

Per message the outcome is one of: ack (the default), ``retry`` (nak with a delay; redelivered up to
``max_deliver`` times), or ``dead`` (published to ``dlq.<subject>`` with the reason in ``Migsched-Error`` and then
acked). A message that cannot be decoded goes to the DLQ without reaching the handler; a handler that raises fails
the whole batch, which is retried (handlers are idempotent); a message delivered ``max_deliver`` times goes to the
DLQ instead of being handled again, so a message that crashes its consumer is not lost either (the broker's own
limit is one higher than ours for that reason). Nothing is dropped silently.

A handler that fails because a server it needs is not there (``outage(exc)``: Redis restarting or failing over)
blames no message: its batch comes back after a pause, the consumer fetches nothing more until then (the pause
doubles while the outage lasts, up to ``MAX_PAUSE_S``), and those deliveries do not count towards
``max_deliver`` (the broker's own limit leaves ``OUTAGE_DELIVERIES`` of room for them). So an outage of a minute
sends no message to the DLQ.

A consumer made with ``acks=False`` is for hints and caches that a periodic reload repairs (a balancer's mirror,
the planner's exit hints): the broker forgets each message once delivered, so neither side spends a message or
any bookkeeping on an ack. Nothing can be redelivered: a batch whose handler fails calls the consumer's ``lost``
callback instead, whose owner must then reload from the source of truth.

Tracing and metrics are this loop's middleware, not the handlers' business: each message gets a CONSUMER span
whose parent is the ``traceparent`` in its headers (``Delivery.ctx`` carries it, and publishing with
``ctx=delivery.ctx`` continues the trace on the next hop; ``traced=False`` makes none, for heartbeats), and each
batch is timed and counted per consumer (``migsched_consumer_batch_seconds``, ``..._batch_size``,
``..._messages_total{outcome}``).

The transport (``shared.bus.transport.Transport``: JetStream, or the in-memory bus) only subscribes and publishes
raw bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from shared import telemetry
from shared.bus.dead_letters import DEAD_LETTERS, reason_class
from shared.bus.errors import SubscriptionClosed
from shared.bus.transport import ConsumerSpec, Inbound, Subscription, Transport
from shared.events import DecodeError, decode

log = logging.getLogger("migsched.bus")
_tracer = telemetry.tracer("migsched.bus")

BATCH_SECONDS = Histogram(
    "migsched_consumer_batch_seconds", "Time a consumer's handler took over one batch, settling included.",
    ["consumer"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SIZE = Histogram(
    "migsched_consumer_batch_size", "Messages per batch handed to a consumer's handler.",
    ["consumer"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
MESSAGES = Counter(
    "migsched_consumer_messages_total", "Messages a consumer settled, by outcome (ack, retry, dead, unacked).",
    ["consumer", "outcome"],
)
class Delivery:
    """One decoded message handed to a handler, with its trace context and its outcome."""

    __slots__ = ("ctx", "data", "msg", "outcome", "reason", "span", "subject")

    def __init__(self, msg: Inbound, data: Any, span: trace.Span, ctx: otel_context.Context) -> None:
        self.msg = msg
        self.subject = msg.subject
        self.data = data
        self.span = span
        self.ctx = ctx
        self.outcome = "ack"
        self.reason = ""

    @property
    def deliveries(self) -> int:
        return self.msg.deliveries

    @property
    def headers(self) -> Mapping[str, str]:
        return self.msg.headers or {}

    def retry(self, reason: str) -> None:
        """Redeliver later (transient fault); dead-letters once ``max_deliver`` is reached."""
        self.outcome, self.reason = "retry", reason

    def dead(self, reason: str) -> None:
        """Unprocessable: dead-letter now with ``reason``."""
        self.outcome, self.reason = "dead", reason


Handler = Callable[[list[Delivery]], Awaitable[None]]
Decoder = Callable[[str, bytes], Any]
Outage = Callable[[BaseException], bool]
MAX_PAUSE_S = 4.0
OUTAGE_DELIVERIES = 20
"""Deliveries an outage may take from a message beyond ``max_deliver`` before the broker stops redelivering it."""
_MAX_OUTAGE_ENTRIES = 100_000


def raw(subject: str, data: bytes) -> bytes:
    """A decoder that hands the bytes over as they are (the dead-letter reader, tools)."""
    return data


class Consumer:
    """A consumer on one subject of one stream, feeding a batch handler."""

    def __init__(
        self,
        bus: Transport,
        stream: str,
        durable: str,
        subject: str,
        handler: Handler,
        *,
        decoder: Decoder | None = None,
        batch: int | None = None,
        fetch_timeout_s: float | None = None,
        max_deliver: int | None = None,
        ack_wait_s: float | None = None,
        retry_delay_s: float = 0.5,
        deliver_new: bool = False,
        ephemeral: bool = False,
        concurrency: int = 1,
        acks: bool = True,
        lost: Callable[[str], None] | None = None,
        linger_s: float | None = None,
        traced: bool = True,
        outage: Outage | None = None,
    ) -> None:
        """``concurrency``: batches handled at once (a handler that waits on Redis or NATS lets the next batch
        start meanwhile; batches may then finish out of order).
        ``ephemeral``: a consumer of this process only (every replica sees every message, from now on; the
        broker removes it soon after the process is gone) instead of a durable shared by replicas.
        ``acks=False``: no acknowledgements (see the module); ``lost(reason)`` is then called for every batch
        the handler could not apply, which will not come back.
        ``linger_s``: this consumer's wait for the rest of a burst (None: ``MIGSCHED_BATCH_LINGER_S``).
        ``traced=False``: no span per message (heartbeats: most of a trace store's spans, and no job's story).
        ``outage(exc)``: True when the handler failed because a server is not there (see the module)."""
        if not acks and lost is None:
            raise ValueError("a consumer without acks needs a `lost` callback: nothing is redelivered")
        st = bus.settings
        self.bus = bus
        self.stream = stream
        self.durable = f"{durable}-{uuid.uuid4().hex[:12]}" if ephemeral else durable
        self.subject = subject
        self.handler = handler
        self.decoder = decoder or (lambda subj, data: decode(subj, data, bus.subjects))
        self.batch = batch or st.batch
        self.fetch_timeout_s = fetch_timeout_s if fetch_timeout_s is not None else st.fetch_timeout_s
        self.max_deliver = max_deliver or st.max_deliver
        self.ack_wait_s = ack_wait_s or st.ack_wait_s
        self.retry_delay_s = retry_delay_s
        self.linger_s = linger_s if linger_s is not None else st.batch_linger_s
        self.concurrency = max(1, concurrency)
        self.traced = traced
        self.deliver_new = deliver_new or ephemeral
        self.ephemeral = ephemeral
        self.acks = acks
        self.lost = lost
        self._sub: Subscription | None = None
        self._stop = asyncio.Event()
        self.outage = outage
        self.pause_s = 0.0
        self._outages: dict[int, int] = {}  # stream seq -> deliveries an outage took from it (this process's)
        self.handled = 0
        self.dead_lettered = 0
        name = durable  # one metric child per consumer role, not per ephemeral instance
        self._m_seconds = BATCH_SECONDS.labels(name)
        self._m_size = BATCH_SIZE.labels(name)
        self._m_outcome = {o: MESSAGES.labels(name, o) for o in ("ack", "retry", "dead", "unacked")}
        self._m_role = name

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            stream=self.stream, name=self.durable, subject=self.subject, acks=self.acks,
            max_deliver=self.max_deliver + 1 + OUTAGE_DELIVERIES, ack_wait_s=self.ack_wait_s,
            deliver_new=self.deliver_new, ephemeral=self.ephemeral, batch=self.batch, linger_s=self.linger_s,
            fetch_timeout_s=self.fetch_timeout_s,
        )

    async def start(self) -> None:
        """Create (or keep) the consumer on the broker and subscribe to it."""
        self._sub = await self.bus.subscribe(self.spec())

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Fetch and handle until ``stop()``; survives reconnects and handler faults."""
        if self._sub is None:
            await self.start()
        await asyncio.gather(*(self._work() for _ in range(self.concurrency)))
        if self._sub is not None:
            await self._sub.stop()

    async def poll(self, timeout: float = 0.0) -> int:
        """Fetch one batch (waiting up to ``timeout`` for it) and handle it; the number of messages handled."""
        if self._sub is None:
            await self.start()
        assert self._sub is not None
        msgs = await self._sub.next_batch(timeout)
        if msgs:
            await self.process(msgs)
        return len(msgs)

    async def _work(self) -> None:
        assert self._sub is not None
        while not self._stop.is_set():
            if self.pause_s > 0:  # a server the handler needs was not there: wait before taking more
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.pause_s):
                        await self._stop.wait()
            try:
                msgs = await self._sub.next_batch(max(self.fetch_timeout_s, 0.2))
            except SubscriptionClosed:
                break
            except Exception as exc:  # reconnecting, no responders during a broker restart: back off and go on
                log.warning("fetch on %s failed: %r", self.durable, exc)
                await asyncio.sleep(0.2)
                continue
            if msgs:
                await self.process(msgs)

    async def process(self, msgs: list[Inbound]) -> None:
        """Decode, hand to the handler, settle every message."""
        t0 = time.perf_counter()
        good: list[Delivery] = []
        # Nothing records without an SDK provider: the sender's (non-recording) span then stands for ours, so
        # what is published while handling continues the sender's trace, and no span is made per message.
        recording = self.traced and telemetry.recording()
        for m in msgs:
            ctx = telemetry.extract(m.headers)
            if recording:
                span = _tracer.start_span(
                    f"{self.subject} process",
                    context=ctx,
                    kind=trace.SpanKind.CONSUMER,
                    attributes={
                        "messaging.system": "nats",
                        "messaging.destination.name": m.subject,
                        "messaging.consumer.group.name": self.durable,
                    },
                )
                sctx = trace.set_span_in_context(span, ctx)
            else:
                span, sctx = trace.get_current_span(ctx), ctx
            try:
                data = self.decoder(m.subject, m.data)
            except DecodeError as exc:
                await self._dead(m, exc.reason, span)
                continue
            except Exception as exc:  # a decoder bug must not kill the consumer: dead-letter the message
                log.exception("decoder of %s failed on %s", self.durable, m.subject)
                await self._dead(m, f"undecodable: {exc!r}"[:500], span)
                continue
            d = Delivery(m, data, span, sctx)
            if self._counted(d) > self.max_deliver:
                await self._dead(m, f"exceeded {self.max_deliver} deliveries", span)
                continue
            good.append(d)
        if good:
            try:
                await self.handler(good)
            except Exception as exc:
                if self.outage is not None and self.outage(exc):
                    self._wait_out(good, exc)
                else:
                    log.exception("handler of %s failed on a batch of %d", self.durable, len(good))
                    for d in good:
                        if d.outcome == "ack":
                            d.retry(f"handler error: {exc!r}"[:500])
            else:
                self.pause_s = 0.0
        if self.acks:
            for d in good:
                await self._settle(d)
        else:
            await self._settle_unacked(good)
        self.handled += len(msgs)
        self._m_size.observe(len(msgs))
        self._m_seconds.observe(time.perf_counter() - t0)

    def _counted(self, d: Delivery) -> int:
        """Deliveries that count towards ``max_deliver``: those an outage took do not."""
        return d.deliveries - self._outages.get(d.msg.stream_seq, 0) if self._outages else d.deliveries

    def _wait_out(self, good: list[Delivery], exc: BaseException) -> None:
        """The batch failed for an outage: it comes back after the pause, and these deliveries do not count."""
        self.pause_s = min(max(2 * self.pause_s, self.retry_delay_s), MAX_PAUSE_S)
        log.warning("%s: a server is not answering (%r); %d message(s) back in %.1f s", self.durable, exc,
                    len(good), self.pause_s)
        if len(self._outages) > _MAX_OUTAGE_ENTRIES:
            self._outages.clear()  # bounded: forgetting only makes those messages count as usual
        for d in good:
            seq = d.msg.stream_seq
            self._outages[seq] = self._outages.get(seq, 0) + 1
            d.outcome, d.reason = "outage", f"server not answering: {exc!r}"[:500]

    async def _settle(self, d: Delivery) -> None:
        try:
            if d.outcome == "ack":
                await d.msg.ack()
                self._m_outcome["ack"].inc()
                if self._outages:
                    self._outages.pop(d.msg.stream_seq, None)
            elif d.outcome == "outage":
                await d.msg.nak(self.pause_s)
                self._m_outcome["retry"].inc()
            elif d.outcome == "retry" and self._counted(d) < self.max_deliver:
                d.span.set_attribute("migsched.retry", d.reason)
                await d.msg.nak(self.retry_delay_s * d.deliveries)
                self._m_outcome["retry"].inc()
            else:
                reason = d.reason if d.outcome == "dead" else f"{d.reason} (after {d.deliveries} deliveries)"
                await self._dead(d.msg, reason, d.span)
                return
        except Exception as exc:  # the ack is lost: the message comes back and the handler is idempotent
            log.warning("settling a message of %s failed: %r", self.durable, exc)
        d.span.end()

    async def _settle_unacked(self, good: list[Delivery]) -> None:
        """Without acks a retry cannot be redelivered: the owner is told once for the batch and reloads."""
        retried = [d for d in good if d.outcome in ("retry", "outage")]
        if retried and self.lost is not None:
            log.warning("%s: %d message(s) not applied and not redelivered (no acks): %s", self.durable,
                        len(retried), retried[0].reason)
            self.lost(retried[0].reason)
        for d in good:
            if d.outcome == "dead":
                await self._dead(d.msg, d.reason, d.span)
            else:
                self._m_outcome["unacked"].inc()
                d.span.end()

    async def _dead(self, m: Inbound, reason: str, span: trace.Span) -> None:
        """Publish the original bytes to ``dlq.<subject>`` with the reason, then ack the original (if acked)."""
        headers = {
            "Nats-Msg-Id": f"dlq:{self.stream}:{m.stream_seq}",
            "Migsched-Error": reason[:1000].replace("\r", " ").replace("\n", " "),
            "Migsched-Original-Subject": m.subject,
            "Migsched-Consumer": self.durable,
            "Migsched-Deliveries": str(m.deliveries),
            "Migsched-Failed-At": f"{time.time():.3f}",
        }
        original_id = (m.headers or {}).get("Nats-Msg-Id")
        if original_id:
            headers["Migsched-Original-Msg-Id"] = original_id
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason[:200]))
        span.set_attribute("migsched.dead_letter", reason[:200])
        try:
            await self.bus.publish_raw(self.bus.subjects.dlq(m.subject), m.data, headers)
            if self.acks:
                await m.ack()
            self.dead_lettered += 1
            self._m_outcome["dead"].inc()
            DEAD_LETTERS.labels(self._m_role, reason_class(reason)).inc()
            log.warning("dead-lettered %s seq %s: %s", m.subject, m.stream_seq, reason)
        except Exception as exc:  # DLQ unreachable: leave the message unacked so it comes back
            log.error("cannot dead-letter %s: %r", m.subject, exc)
        span.end()
