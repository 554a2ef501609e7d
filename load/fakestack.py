"""A stand-in for the live stack, for trying the load tools and testing them: every ``jobs.submit`` becomes,
in order, a ``sched.placed``, a ``place`` command on ``cmd.<node>``, a ``cmd_done`` report and, after the
job's ``duration_hint_s``, a ``jobs.exit`` — with the field names of ``shared.events`` but none of its
payloads (it places nothing). It listens with a core subscription, so it sees the same messages the
generator stores in JetStream. Never point it at a namespace a real stack is using.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import msgspec

from shared.events import JobSubmit, Subjects

_submit = msgspec.json.Decoder(JobSubmit)
_enc = msgspec.json.Encoder()


class FakeStack:
    def __init__(self, nc: Any, subjects: Subjects, nodes: Sequence[str] = ("node-a", "node-b"),
                 exits: bool = True) -> None:
        self.nc, self.subjects, self.exits = nc, subjects, exits
        self._nodes = itertools.cycle(nodes)
        self._sub: Any = None
        self._stopped = False
        self._pending: set[asyncio.Future[None]] = set()
        self.handled = 0

    async def ensure_stream(self) -> None:
        """A memory stream for the namespace's ``jobs.>`` so the generator's publishes are acknowledged (the
        real stack creates its own streams)."""
        from nats.js.api import StorageType, StreamConfig

        name = self.subjects.stream_jobs
        await self.nc.jetstream().add_stream(StreamConfig(
            name=name, subjects=self.subjects.streams()[name], storage=StorageType.MEMORY, max_age=600))

    async def remove_stream(self) -> None:
        await self.nc.jetstream().delete_stream(self.subjects.stream_jobs)

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.subjects.jobs_submit, cb=self._on_submit,
                                            pending_msgs_limit=10_000_000, pending_bytes_limit=-1)
        await self.nc.flush()

    async def stop(self) -> None:
        self._stopped = True  # exits still scheduled are dropped
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def _on_submit(self, msg: Any) -> None:
        job = _submit.decode(msg.data)
        node = next(self._nodes)
        s, jid = self.subjects, job.job_id
        await self.nc.publish(s.sched_placed, _enc.encode({"v": 1, "id": f"p-{jid}", "job_id": jid}))
        await self.nc.publish(s.cmd(node), _enc.encode({"v": 1, "id": f"c-{jid}", "cmd_id": f"c-{jid}",
                                                        "kind": "place", "node": node, "job_id": jid}))
        started = {"v": 1, "id": f"r-{jid}", "kind": "cmd_done", "node": node, "job_id": jid,
                   "cmd_id": f"c-{jid}", "command": "place"}
        await self.nc.publish(s.node_report(node), _enc.encode(started))
        self.handled += 1
        if self.exits:
            payload = _enc.encode({"v": 1, "id": f"x-{jid}", "job_id": jid, "node": node,
                                   "kind": "completed"})
            asyncio.get_running_loop().call_later(job.duration_hint_s or 0.0, self._exit, payload)

    def _exit(self, payload: bytes) -> None:
        if not self._stopped:
            fut = asyncio.ensure_future(self.nc.publish(self.subjects.jobs_exit, payload))
            self._pending.add(fut)  # keep a reference until done (asyncio holds tasks weakly)
            fut.add_done_callback(self._pending.discard)
