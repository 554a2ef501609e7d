"""Durable pull consumer loop: fetch a batch, decode, hand the batch to a handler, ack; dead-letter poison.

Per message the outcome is one of: ack (the default), ``retry`` (nak with a delay; redelivered up to
``max_deliver`` times), or ``dead`` (published to ``dlq.<subject>`` with the reason in ``Migsched-Error`` and
then acked). A message that cannot be decoded goes to the DLQ without reaching the handler; a handler that
raises
fails the whole batch, which is retried (handlers are idempotent); a message delivered ``max_deliver`` times
goes to the DLQ instead of being handled again, so a message that crashes its consumer is not lost either
(the server's own ``max_deliver`` is one higher than ours for that reason). Nothing is dropped silently.

A consumer made with ``acks=False`` (``AckPolicy.NONE``) is for hints and caches that a periodic reload
repairs (a balancer's mirror, the planner's exit hints): the server forgets each message once delivered, so
neither side spends a message or any bookkeeping on an ack. Nothing can be redelivered: a batch whose handler
fails calls the consumer's ``lost`` callback instead, whose owner must then reload from the source of truth.

Tracing: each message gets a CONSUMER span whose parent is the ``traceparent`` in its headers;
``Delivery.ctx`` carries it, and publishing with ``ctx=delivery.ctx`` continues the trace on the next hop. A
consumer made with ``traced=False`` (the node registry's heartbeats) makes no span.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import context as otel_context
from opentelemetry import trace

from shared import telemetry
from shared.bus.puller import Puller
from shared.events import DecodeError, decode

log = logging.getLogger("migsched.bus")
_tracer = telemetry.tracer("migsched.bus")


class Delivery:
    """One decoded message handed to a handler, with its trace context and its outcome."""

    __slots__ = ("ctx", "data", "msg", "outcome", "reason", "span", "subject")

    def __init__(self, msg: Msg, data: Any, span: trace.Span, ctx: otel_context.Context) -> None:
        self.msg = msg
        self.subject = msg.subject
        self.data = data
        self.span = span
        self.ctx = ctx
        self.outcome = "ack"
        self.reason = ""

    @property
    def deliveries(self) -> int:
        return delivered(self.msg)

    def retry(self, reason: str) -> None:
        """Redeliver later (transient fault); dead-letters once ``max_deliver`` is reached."""
        self.outcome, self.reason = "retry", reason

    def dead(self, reason: str) -> None:
        """Unprocessable: dead-letter now with ``reason``."""
        self.outcome, self.reason = "dead", reason


def delivered(msg: Msg) -> int:
    """How many times JetStream has delivered ``msg``, read straight from its ack subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>...``, or with domain and account hash in front): the full
    metadata parse costs more than a small handler does per message."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:
        return int(tokens[4])
    if len(tokens) >= 11:
        return int(tokens[6])
    return int(msg.metadata.num_delivered)


Handler = Callable[[list[Delivery]], Awaitable[None]]
Decoder = Callable[[str, bytes], Any]


class Consumer:
    """A durable pull consumer on one subject of one stream, feeding a batch handler."""

    def __init__(
        self,
        bus: Any,
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
    ) -> None:
        """``concurrency``: batches handled at once (a handler that waits on Redis or NATS lets the next batch
        start meanwhile; batches may then finish out of order).
        ``ephemeral``: a consumer of this process only (every replica sees every message, from now on; the
        server removes it 30 s after the process is gone) instead of a durable shared by replicas.
        ``acks=False``: no acknowledgements (see the module); ``lost(reason)`` is then called for every batch
        the handler could not apply, which will not come back.
        ``linger_s``: this consumer's wait for the rest of a burst (None: ``MIGSCHED_BATCH_LINGER_S``).
        ``traced=False``: no span per message (heartbeats: most of a trace store's spans, and no job's story)."""
        if not acks and lost is None:
            raise ValueError("a consumer without acks needs a `lost` callback: nothing is redelivered")
        st = bus.settings
        self.bus = bus
        self.stream = stream
        self.durable = durable
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
        if ephemeral:
            import uuid

            self.durable = f"{durable}-{uuid.uuid4().hex[:12]}"
        self._sub: Any = None
        self._stop = asyncio.Event()
        self.handled = 0
        self.dead_lettered = 0

    async def start(self) -> None:
        """Create (or keep) the durable consumer and bind a pull subscription to it."""
        js = self.bus.js
        cfg = api.ConsumerConfig(
            durable_name=self.durable,
            filter_subject=self.subject,
            ack_policy=api.AckPolicy.EXPLICIT if self.acks else api.AckPolicy.NONE,
            max_deliver=self.max_deliver + 1,
            ack_wait=self.ack_wait_s,
            max_ack_pending=20000,
            deliver_policy=api.DeliverPolicy.NEW if self.deliver_new else api.DeliverPolicy.ALL,
            max_waiting=64,
        )
        if self.ephemeral:
            cfg.durable_name = None
            cfg.name = self.durable
            cfg.inactive_threshold = 30.0
            await js.add_consumer(self.stream, cfg)
            await self._bind()
            return
        try:
            await js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            try:
                await js.add_consumer(self.stream, cfg)
            except BadRequestError as exc:  # created concurrently by a replica
                log.debug("consumer %s: %s", self.durable, exc)
        await self._bind()

    async def _bind(self) -> None:
        self._sub = Puller(
            self.bus.nc,
            self.stream,
            self.durable,
            self.batch,
            expires_s=max(1.0, min(30.0, self.fetch_timeout_s * 100)),
            linger_s=self.linger_s,
        )
        await self._sub.start()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Fetch and handle until ``stop()``; survives NATS reconnects and handler faults."""
        if self._sub is None:
            await self.start()
        await asyncio.gather(*(self._work() for _ in range(self.concurrency)))
        await self._sub.stop()

    async def _work(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = await self._sub.next_batch(max(self.fetch_timeout_s, 0.2))
            except nats.errors.ConnectionClosedError:
                break
            except Exception as exc:  # reconnecting, no responders during a NATS restart: back off and go on
                log.warning("fetch on %s failed: %r", self.durable, exc)
                await asyncio.sleep(0.2)
                continue
            if msgs:
                await self.process(msgs)

    async def process(self, msgs: list[Msg]) -> None:
        """Decode, hand to the handler, settle every message."""
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
            if d.deliveries > self.max_deliver:
                await self._dead(m, f"exceeded {self.max_deliver} deliveries", span)
                continue
            good.append(d)
        if good:
            try:
                await self.handler(good)
            except Exception as exc:
                log.exception("handler of %s failed on a batch of %d", self.durable, len(good))
                for d in good:
                    if d.outcome == "ack":
                        d.retry(f"handler error: {exc!r}"[:500])
        if self.acks:
            for d in good:
                await self._settle(d)
        else:
            await self._settle_unacked(good)
        self.handled += len(msgs)

    async def _settle(self, d: Delivery) -> None:
        try:
            if d.outcome == "ack":
                await d.msg.ack()
            elif d.outcome == "retry" and d.deliveries < self.max_deliver:
                d.span.set_attribute("migsched.retry", d.reason)
                await d.msg.nak(delay=self.retry_delay_s * d.deliveries)
            else:
                reason = d.reason if d.outcome == "dead" else f"{d.reason} (after {d.deliveries} deliveries)"
                await self._dead(d.msg, reason, d.span)
                return
        except Exception as exc:  # the ack is lost: the message comes back and the handler is idempotent
            log.warning("settling a message of %s failed: %r", self.durable, exc)
        d.span.end()

    async def _settle_unacked(self, good: list[Delivery]) -> None:
        """Without acks a retry cannot be redelivered: the owner is told once for the batch and reloads."""
        retried = [d for d in good if d.outcome == "retry"]
        if retried and self.lost is not None:
            log.warning("%s: %d message(s) not applied and not redelivered (no acks): %s", self.durable,
                        len(retried), retried[0].reason)
            self.lost(retried[0].reason)
        for d in good:
            if d.outcome == "dead":
                await self._dead(d.msg, d.reason, d.span)
            else:
                d.span.end()

    async def _dead(self, m: Msg, reason: str, span: trace.Span) -> None:
        """Publish the original bytes to ``dlq.<subject>`` with the reason, then ack the original (if acked)."""
        md = m.metadata
        headers = {
            "Nats-Msg-Id": f"dlq:{md.stream}:{md.sequence.stream}",
            "Migsched-Error": reason[:1000].replace("\r", " ").replace("\n", " "),
            "Migsched-Original-Subject": m.subject,
            "Migsched-Consumer": self.durable,
            "Migsched-Deliveries": str(md.num_delivered),
            "Migsched-Failed-At": f"{time.time():.3f}",
        }
        if m.headers and "Nats-Msg-Id" in m.headers:
            headers["Migsched-Original-Msg-Id"] = m.headers["Nats-Msg-Id"]
        span.set_status(trace.Status(trace.StatusCode.ERROR, reason[:200]))
        span.set_attribute("migsched.dead_letter", reason[:200])
        try:
            await self.bus.js.publish(self.bus.subjects.dlq(m.subject), m.data, headers=headers)
            if self.acks:
                await m.ack()
            self.dead_lettered += 1
            log.warning("dead-lettered %s seq %s: %s", m.subject, md.sequence.stream, reason)
        except Exception as exc:  # DLQ unreachable: leave the message unacked so it comes back
            log.error("cannot dead-letter %s: %r", m.subject, exc)
        span.end()
