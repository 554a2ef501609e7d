"""The registry's view of the nodes: registrations, heartbeats, liveness, command time-outs.

- ``registered``: the node's GPUs are written into Redis (a new GPU adopts the instances the node reports as
  idle; a known one is reconciled, see ``lua/node.lua``), then ``sched.capacity`` tells the balancer.
- ``node.<node>.heartbeat``: last-seen time (the registry's clock, not the node's: no skew). A heartbeat from a
  node the registry considers lost, or never saw register, gets a ``resync`` command: stop the listed jobs
  (they were re-queued elsewhere) and register again.
- liveness (every ``node_timeout_s / 5``): a node silent for ``node_timeout_s`` is marked lost; its GPUs become
  unhealthy and empty and its jobs go back to the queue (one Lua script), then ``sched.capacity``.
- commands without a result for ``cmd_timeout_s``: a placement is failed (re-queued), others are forgotten.
  Like a node's silence, a command's wait counts only while the registry could have heard the result
  (``liveness.py``): a command still queued in the stream during a bus outage is not late, and failing its
  placement would let the executor run the job twice.

Executors never touch Redis: everything they say arrives here as a message.
"""

from __future__ import annotations

import time
from typing import Any

from services.common.metric_cache import child
from services.common.service import Context
from services.common.stop_command import stop_command
from services.registry import metrics as m
from services.registry.commands import member_stops, part_stops, place_attempt
from services.registry.liveness import LivenessWatch, overdue
from shared.bus import Delivery, Outgoing
from shared.errors import UnknownModelError
from shared.events import CapacityChanged, Command, Registered
from shared.state import gpu_id_of


class Nodes:
    def __init__(self, ctx: Context) -> None:
        self.state = ctx.state
        self.bus = ctx.bus
        self.subjects = ctx.bus.subjects
        self.settings = ctx.settings
        self.geometry = ctx.geometry
        self.log = ctx.log
        self.node_state: dict[str, str] = {}
        """Each node's state as this process last saw it: a heartbeat from a node not ``up`` here asks Redis."""
        self.watch = LivenessWatch(ctx.settings.node_timeout_s, time.monotonic())

    async def on_registered(self, d: Delivery) -> None:
        r: Registered = d.data
        now = time.time()
        gpus: list[dict[str, Any]] = []
        for g in r.gpus:
            try:
                model = self.geometry.model(g.model)
            except UnknownModelError:
                self.log.warning("node %s GPU %d: unknown model %r, not scheduled", r.node, g.index, g.model)
                continue
            gid = gpu_id_of(r.node, g.index)
            insts = []
            # a GPU not in MIG mode holds no MIG instances (a report of some is drift, never adopted); its jobs
            # (whole GPU or time-sliced shares) are reported by job id
            for i in g.instances if g.mig_enabled else ():
                if not model.has_profile(i.profile):
                    self.log.warning("node %s GPU %d: unknown profile %r ignored", r.node, g.index, i.profile)
                    continue
                p = model.profile(i.profile)
                iid = i.instance_id or f"{gid}:{p.name}@{i.start}:adopted{i.gi_id}"
                inst: dict[str, Any] = {
                    "id": iid,
                    "profile": p.name,
                    "start": i.start,
                    "size": p.memory_slices,
                    "compute": p.compute_slices,
                }
                if i.job_id:  # never adopted idle: the state keeps it occupied and we stop the job (below)
                    inst["job"] = i.job_id
                insts.append(inst)
            gpus.append(
                {
                    "id": gid,
                    "index": g.index,
                    "model": model.name,
                    "mig": g.mig_enabled,
                    "healthy": g.healthy,
                    "uuid": g.uuid,
                    "instances": insts,
                    "replicas": 0 if g.mig_enabled else g.replicas,
                    "jobs": [] if g.mig_enabled else list(g.jobs),
                }
            )
        if not gpus:
            return
        res = await self.state.register_node(r.node, gpus, now, r.id, r.addr, r.labels)
        if res.get("replay"):
            self.log.info("node %s: registration %s already applied (redelivered); nothing changed", r.node, r.id)
        self.node_state[r.node] = "up"
        if res["drift"]:
            self.log.warning("node %s registered with drift: %s", r.node, "; ".join(res["drift"]))
        if res["requeued"]:
            self.log.warning("node %s: re-queued %s", r.node, ", ".join(res["requeued"]))
        d.span.set_attribute("migsched.gpus", len(gpus))
        stops = res.get("stops") or ()
        foreign = [s for s in stops if len(s) == 3]
        parts = [s for s in stops if len(s) == 4]  # a gang re-queued from this node: its parts on other nodes
        out = [self.stop_foreign(r, job, gpu, iid, now, d) for job, gpu, iid in foreign]
        out.extend(Outgoing(self.subjects.cmd(c.node), c, d.ctx) for c in part_stops(parts, now))
        if foreign:
            self.log.warning("node %s runs job(s) the state does not hold there; stopping %s", r.node,
                             ", ".join(s[0] for s in foreign))
        out.append(
            Outgoing(
                self.subjects.sched_capacity,
                CapacityChanged(
                    id=f"cap-reg-{r.node}-{r.id}"[:200],
                    gpu_ids=tuple(res["gpus"]),
                    reason=f"node {r.node} registered",
                    at=now,
                ),
                d.ctx,
            )
        )
        await self.bus.publish_batch(out)

    def stop_foreign(self, r: Registered, job: str, gpu: str, iid: str, now: float, d: Delivery) -> Outgoing:
        """A ``stop`` for a job the node runs where the state does not hold it (its instance stays occupied
        until the exit or the stop's confirmation, ``Reports``). One per registration: a redelivered
        registration is a replay, and a later one that still finds the job sends another. Only that run: by the
        time the stop arrives the job may run here again, placed anew (a run the executor cannot name, adopted
        from the driver, is stopped all the same). When the node said which command started that run, only
        that command's run: a later one of the job on an instance of the same id is left alone too."""
        by = next((i.started_by for g in r.gpus for i in g.instances if i.job_id == job and i.started_by), None)
        cmd = stop_command(r.node, job, f"stop:{job}:{r.id}", gpu, iid, now, only_that_run=True, started_by=by)
        return Outgoing(self.subjects.cmd(r.node), cmd, d.ctx)

    async def on_heartbeat(self, ds: list[Delivery]) -> None:
        now = time.time()
        self.watch.heard(time.monotonic())
        await self.state.heartbeat([(d.data.node, now) for d in ds])
        out: list[Outgoing] = []
        fresh: dict[str, dict[str, str]] | None = None
        for d in ds:
            hb = d.data
            if self.node_state.get(hb.node) == "up":
                continue
            # Not up in this process's view: ask Redis, not the cache. Another replica may have applied the
            # node's new registration already, and a resync sent then would stop jobs placed there since.
            if fresh is None:
                fresh = await self.state.nodes()
            h = fresh.get(hb.node, {})
            st = self.node_state[hb.node] = h.get("state", "unknown")
            if st == "up":
                continue
            # One resync per loss (its id names the loss): each one re-registers the node, and a registration
            # racing with the node's placements re-queues jobs that run. Unknown nodes: one per 10 s.
            episode = h.get("lost_at", "") if st == "lost" else ""
            cid = f"resync:{hb.node}:{episode or int(now // 10)}"
            out.append(
                Outgoing(
                    self.subjects.cmd(hb.node),
                    Command(
                        id=cid,
                        cmd_id=cid,
                        kind="resync",
                        node=hb.node,
                        stop_jobs=hb.running if st == "lost" else (),
                        at=now,
                    ),
                )
            )
        if out:
            await self.bus.publish_batch(out)

    def heard_from(self, now: float) -> float | None:
        """The wall time from which silence counts (``LivenessWatch.silence_from``), None: judge nothing now."""
        mono = time.monotonic()
        start = self.watch.silence_from(self.bus.health, mono)
        return None if start is None else now - (mono - start)

    async def check_liveness(self) -> None:
        now = time.time()
        heard_from = self.heard_from(now)
        nodes = await self.state.nodes()
        counts = {"up": 0, "lost": 0}
        timeout = self.settings.node_timeout_s
        for node, h in nodes.items():
            st = h.get("state", "up")
            if st == "up" and overdue(float(h.get("last_seen", "0") or 0), now, timeout, heard_from):
                res = await self.state.node_lost(node, now, f"node {node} missed heartbeats for {timeout:g}s")
                self.log.warning("node %s lost; re-queued %d job(s)", node, len(res["requeued"]))
                stops = part_stops(res.get("stops") or (), now)  # gangs that ran a part there: the other parts
                if stops:
                    await self.bus.publish_batch([Outgoing(self.subjects.cmd(c.node), c) for c in stops])
                st = "lost"
                await self.bus.publish(
                    self.subjects.sched_capacity,
                    CapacityChanged(
                        id=f"cap-lost-{node}-{int(now)}",
                        gpu_ids=tuple(res["gpus"]),
                        reason=f"node {node} lost",
                        at=now,
                    ),
                )
            self.node_state[node] = st
            counts[st] = counts.get(st, 0) + 1
        for st, n in counts.items():
            child(m.NODES, st).set(n)

    async def sweep_commands(self) -> None:
        now = time.time()
        timeout = self.settings.cmd_timeout_s
        heard_from = self.heard_from(now)
        if not overdue(float("-inf"), now, timeout, heard_from):
            return  # the bus is down or back for less than the timeout: no wait can have run its course
        for shard in range(self.settings.shards):
            cmds = await self.state.commands(shard)
            tracked = {info.get("job") for info in cmds.values()}
            # reserved, but its command never went out (a crash between commit and publish): start again
            for job in await self.state.placing_since(shard, now - timeout):
                if job not in tracked:
                    await self.placement_failed(job, "no command was sent for the placement", "")
            for cid, info in cmds.items():
                if not overdue(float(info.get("at", now)), now, timeout, heard_from):
                    continue
                if info.get("kind") == "place" and info.get("job"):
                    await self.placement_failed(
                        info["job"], f"no result for {cid} within {self.settings.cmd_timeout_s:g}s", cid
                    )
                await self.state.forget_command(shard, cid)
                child(m.COMMANDS, info.get("kind", "?"), "timeout").inc()

    async def placement_failed(self, job_id: str, why: str, cmd_id: str) -> None:
        now = time.time()
        status, new_state, gpu, stops = await self.state.fail_placement(
            job_id, why, now, self.settings.max_attempts, cmd_id, place_attempt(cmd_id, job_id)
        )
        if stops:  # the members of a gang across nodes that started already
            await self.bus.publish_batch([Outgoing(self.subjects.cmd(c.node), c)
                                          for c in member_stops(job_id, stops, now)])
        if status == "ok":
            self.log.info("placement of %s failed (%s): job now %s", job_id, why, new_state)
            await self.bus.publish(
                self.subjects.sched_capacity,
                CapacityChanged(
                    id=f"cap-fail-{job_id}-{int(now * 1000)}"[:200],
                    gpu_ids=tuple(g for g in gpu.split(",") if g),
                    reason=why[:500],
                    at=now,
                ),
            )
