"""``migsched dashboard``: a read-only web page of the cluster, served from the state store.

Every ``every_s`` the server reads the cluster as ``migsched status`` does (``clusterview.read``), adds the last
decisions (the placing transitions of the jobs placed most recently) and a sample of utilisation and
fragmentation to an hour's history, and keeps the result as one JSON document. The page (``dashboard.html``)
fetches it each second and draws it: every GPU as a row of its memory slices coloured by tenant and labelled by
job, idle instances hatched, reserved slices and held GPUs marked, Lazy/Busy and FragCost per GPU; the queue
with its reasons and reservations; the history; the decisions.

It binds to 127.0.0.1 unless told otherwise and answers only ``GET`` of the page and of ``/api/view``: it has
no way to change anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from importlib import resources
from typing import Any

import msgspec

from migsched.clusterview import ClusterView, GpuRow, read
from shared.mig.geometry import Geometry
from shared.policy.fragcost import UNIFORM_SHAPES, frag_rate
from shared.policy.gpu_view import GpuView, InstanceView
from shared.policy.snapshot import snapshot_of
from shared.state import RedisState

log = logging.getLogger("migsched.dashboard")
HISTORY_S = 3600.0
DECISIONS = 12
_ACTIVE = ("placing", "running", "migrating")


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    at: float
    reason: str


def fragmentation(view: ClusterView, geometry: Geometry) -> float:
    """The cluster's fragmentation rate (share of free memory slices the uniform demand mix cannot use)."""
    known = {m.name for m in geometry.models}
    gpus = [_as_view(g) for g in view.gpus if g.model in known and g.mig]  # a plain GPU has no slices to strand
    return frag_rate(snapshot_of(geometry, gpus), UNIFORM_SHAPES) if gpus else 0.0


def _as_view(g: GpuRow) -> GpuView:
    busy = [InstanceView(id=i.id, profile=i.profile, start=i.start, size=i.size, compute=i.compute,
                         job_id=i.job_id or "?") for i in g.instances if i.state != "idle"]
    return GpuView.build(id=g.id, node=g.node, index=g.index, model=g.model, healthy=g.healthy, instances=busy)


def page_data(view: ClusterView, geometry: Geometry, threshold: float, history: Sequence[tuple[float, float, float]],
              decisions: Sequence[Decision]) -> dict[str, Any]:
    """What the page draws: plain JSON, every number the page shows computed here."""
    held = {gid: h.job_id for h in view.holds for gid in h.gpus}
    models = {m.name: m for m in geometry.models}
    total = view.total_slices
    gpus = []
    for g in view.gpus:
        model = models.get(g.model)
        # a GPU not in MIG mode has no slices: one column for its whole-GPU job, or one per time-sliced share
        columns = (model.memory_slices if model else 8) if g.mig else max(1, g.replicas)
        gpus.append({
            "id": g.id, "node": g.node, "model": g.model, "healthy": g.healthy,
            "slices": columns,
            "tier": "lazy" if g.load < threshold else "busy", "load": g.load, "frag_cost": g.frag_cost,
            "held_for": held.get(g.id),
            "cells": [{"start": i.start if g.mig or g.replicas else 0, "size": i.size if g.mig else 1,
                       "profile": i.profile, "state": i.state, "job": i.job_id,
                       "tenant": view.rows[i.job_id].tenant if i.job_id in view.rows else ""}
                      for i in g.instances],
        })
    pending = sorted((j for j, s in view.jobs.items() if s == "pending"),
                     key=lambda j: view.rows[j].since if j in view.rows else 0.0)
    queue = [{"job": j, "tenant": view.rows[j].tenant if j in view.rows else "",
              "demand": view.rows[j].demand if j in view.rows else "",
              "age_s": round(view.at - view.rows[j].since, 1) if j in view.rows else None,
              "reason": view.reasons.get(j, "")} for j in pending]
    return {
        "at": view.at, "namespace": view.namespace, "threshold": threshold,
        "summary": {"gpus": len(view.gpus), "busy_slices": view.busy_slices, "total_slices": total,
                    "utilisation": round(view.busy_slices / total, 4) if total else 0.0,
                    "fragmentation": history[-1][2] if history else 0.0,
                    "nodes": view.nodes, "counts": view.counts},
        "gpus": gpus,
        "queue": queue,
        "holds": [{"job": h.job_id, "gpus": list(h.gpus), "start": h.start, "reason": h.explain(view.at)}
                  for h in view.holds],
        "history": [list(s) for s in history],
        "decisions": [msgspec.to_builtins(d) for d in decisions],
    }


class Dashboard:
    """Reads the cluster every ``every_s`` and serves it; ``serve`` runs until ``stop`` is set."""

    def __init__(self, state: RedisState, geometry: Geometry, threshold: float = 0.4, every_s: float = 1.0) -> None:
        self.state = state
        self.geometry = geometry
        self.threshold = threshold
        self.every_s = every_s
        self.history: deque[tuple[float, float, float]] = deque(maxlen=max(1, int(HISTORY_S / every_s)))
        self.payload = b"{}"
        self.page = resources.files("migsched").joinpath("dashboard.html").read_bytes()

    async def refresh(self) -> None:
        view = await read(self.state, self.geometry)
        total = view.total_slices
        self.history.append((round(view.at, 3), round(view.busy_slices / total, 4) if total else 0.0,
                             round(fragmentation(view, self.geometry), 4)))
        data = page_data(view, self.geometry, self.threshold, self.history, await self._decisions(view))
        self.payload = msgspec.json.encode(data)

    async def _decisions(self, view: ClusterView) -> list[Decision]:
        """The placing transitions of the active jobs submitted last (one history read each)."""
        active = sorted((j for j, s in view.jobs.items() if s in _ACTIVE),
                        key=lambda j: view.rows[j].since if j in view.rows else 0.0, reverse=True)[:DECISIONS]
        out = []
        for j in active:
            placed = [h for h in await self.state.history(j) if h.to == "placing"]
            if placed:
                out.append(Decision(job_id=j, at=placed[-1].at, reason=placed[-1].reason))
        return sorted(out, key=lambda d: -d.at)

    async def serve(self, host: str, port: int, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self._handle, host, port)
        if ready is not None:
            ready.set()
        log.info("dashboard on http://%s:%d/", host, port)
        try:
            while not stop.is_set():
                try:
                    await self.refresh()
                except Exception as exc:  # Redis away: keep serving the last view, say why in the log
                    log.warning("dashboard refresh failed: %r", exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every_s)
        finally:
            server.close()
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass  # headers: nothing in them changes the answer
            parts = request.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) >= 2 else ("", "")
            if method != "GET":
                await _respond(writer, 405, b"read-only: GET only\n", "text/plain", {"Allow": "GET"})
            elif path == "/":
                await _respond(writer, 200, self.page, "text/html; charset=utf-8")
            elif path == "/api/view":
                await _respond(writer, 200, self.payload, "application/json")
            else:
                await _respond(writer, 404, b"not found\n", "text/plain")
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str,
                   extra: dict[str, str] | None = None) -> None:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {kind}", f"Content-Length: {len(body)}",
            "Cache-Control: no-store", "Connection: close", *(f"{k}: {v}" for k, v in (extra or {}).items())]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()


async def run(state: RedisState, geometry: Geometry, host: str, port: int, threshold: float,
              stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    try:
        await Dashboard(state, geometry, threshold).serve(host, port, stop)
    finally:
        await state.close()
