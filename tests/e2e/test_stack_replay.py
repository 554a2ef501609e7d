"""End to end: the stack as separate processes (balancer, registry, migration-planner, two simulated
executors of 8 x A100-40GB) replays a synthetic workload at a speed-up, and the outcome is compared with the
simulator's for the same input, cluster and policy (``migsched``, threshold 0.4).

What must hold exactly: every job is accounted for exactly once (one terminal state in Redis, at most one
``jobs.exit`` per job and exactly one per finished job), and the state invariants hold throughout (no slice
double-booked, occupancy bytes match instances, reservations match jobs), audited while the replay runs and at
the end, when no instance may be left busy.

What must agree within a tolerance (the live stack is not the simulator):

- The live stack runs on wall time. Every hop (submit -> balancer -> registry -> executor -> report) takes
a
  few to some tens of milliseconds of wall time, which the speed-up turns into seconds of trace time: the live
  wait is the pipeline latency times the speed-up, where the simulator's is ~0 on an empty cluster. So JCTs
  are compared with a relative tolerance plus an absolute allowance of (live wait - simulated wait).
- Arrivals are published by a timer (batches of what is due), and decisions made in a different order of
  ties shift which GPU a job lands on, hence the fragmentation, migration and reconfiguration counts differ.
  Those are compared loosely (fragmentation within 0.15 absolute) or not at all (migrations: the live planner
  runs on wall-time cooldowns and sees exits in batches).
- Rejections (patience expiry) depend on queueing at the margins: completed counts within 5 % of the jobs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pytest
from stack_fixture import exits_on_stream, running_stack, settings_of

from migsched import livekpis, replayer
from shared.bus import JetStreamBus
from shared.client import MigschedClient
from shared.mig.geometry import default_geometry
from shared.sim.jobs import Workload
from shared.sim.workloads.synthetic import CLASSES, synthetic
from shared.state import TERMINAL_STATES, RedisState, Violation, audit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

SPEEDUP = 4000.0
JOBS = 80
MODEL = "A100-40GB"
PER_GPU = {"overlap", "placement", "count", "profile", "model"}


async def _replay_and_audit(
    stack: object, workload: object, n_gpus: int = 16
) -> tuple[dict, dict, list[Violation], list, float]:
    geometry = default_geometry()
    st = settings_of(stack)  # type: ignore[arg-type]
    state = RedisState.from_settings(st)
    violations: list[Violation] = []
    await stack.wait_ready(60)  # type: ignore[attr-defined]  # its services create the streams
    async with MigschedClient(st.nats_url, namespace=st.namespace) as client:
        sampler = livekpis.Sampler(state, geometry, workload, every_s=0.2)  # type: ignore[arg-type]
        sampling = asyncio.create_task(sampler.run())
        t0 = time.time()
        rep = await replayer.replay(client, workload, SPEEDUP)  # type: ignore[arg-type]
        ids = [j.id for j in workload.jobs]  # type: ignore[attr-defined]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            stack.check_alive()  # type: ignore[attr-defined]
            # while it runs only the checks within one GPU's hash are exact (one key, written by one Lua
            # script); the cross-key checks (occupancy byte, job <-> instance) read several keys
            # non-atomically
            violations += [v for v in await audit(state, geometry) if v.kind in PER_GPU]
            recs = await state.jobs(ids)
            if all(r is not None and r.state in TERMINAL_STATES for r in recs):
                break
            await asyncio.sleep(0.5)
        wall = time.time() - t0
        sampler.stop()
        await sampling
        violations += await audit(state, geometry)  # quiescent now: every check is exact
        outcomes = await livekpis.outcomes(state, ids)
        gpus = await state.load_gpus()
    reconf = sum(
        int(livekpis.scrape(port, "migsched_executor_reconfigurations_total"))
        for name, port in stack.metrics_ports.items()
        if name.startswith("executor")
    )  # type: ignore
    kp = livekpis.kpis(
        workload,
        rep,
        outcomes,
        sampler.samples,
        geometry,
        MODEL,
        n_gpus,  # type: ignore[arg-type]
        reconfigurations=reconf,
        wall_s=wall,
    )
    bus = await JetStreamBus.connect(st)
    try:
        exits = await exits_on_stream(bus)
    finally:
        await bus.close()
    await state.close()
    busy_left = [(g.id, i.id, i.state) for g in gpus for i in g.instances if i.state != "idle"]
    return outcomes, kp, violations, [exits, busy_left], wall


def test_a_replayed_workload_is_accounted_for_and_matches_the_simulator(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    model = default_geometry().model(MODEL)
    workload, skipped = replayer.single_instance(
        replayer.load("synthetic", model, limit=JOBS, seed=7, gpus=16)
    )
    assert not skipped and len(workload.jobs) == JOBS
    simulated = livekpis.simulate(workload, 2, 8, MODEL)
    with running_stack(prefix, nats_url, redis_url, tmp_path, speedup=SPEEDUP) as stack:
        outcomes, live, violations, (exits, busy_left), _ = asyncio.run(_replay_and_audit(stack, workload))
    (tmp_path / "kpis.json").write_text(json.dumps({"live": live, "simulator": simulated}, indent=2))
    (tmp_path / "exits.json").write_text(json.dumps([msgspec.to_builtins(e) for e in exits], indent=1))
    print(json.dumps({"live": live, "simulator": simulated}, indent=2))

    # every job accounted for exactly once
    assert set(outcomes) == {j.id for j in workload.jobs}
    missing = [j for j, o in outcomes.items() if o is None]
    assert missing == []
    states = Counter(o.state for o in outcomes.values() if o is not None)
    assert set(states) <= TERMINAL_STATES, states
    per_job = Counter(e.job_id for e in exits)
    assert [(e.job_id, e.instance_id, e.kind, e.node, e.reason) for e in exits if per_job[e.job_id] > 1] == []
    finished = {j for j, o in outcomes.items() if o is not None and o.state == "finished"}
    assert finished == {j for j, e in ((e.job_id, e) for e in exits) if e.kind == "completed"}
    # no slice double-booked, ever; nothing left reserved or busy
    assert [str(v) for v in violations] == []
    assert busy_left == []

    # the same KPIs within the stated tolerances
    n = JOBS
    assert abs(live["completed"] - simulated["completed"]) <= 0.05 * n
    allowance = max(0.0, float(live["wait_mean_s"]) - float(simulated["wait_mean_s"]))
    for key in ("jct_mean_s", "jct_p50_s", "jct_p95_s"):
        assert abs(live[key] - simulated[key]) <= 0.15 * simulated[key] + 1.5 * allowance, key
    assert abs(live["makespan_s"] - simulated["makespan_s"]) <= 0.10 * simulated["makespan_s"] + allowance
    assert abs(live["utilization"] - simulated["utilization"]) <= 0.15 * simulated["utilization"]
    assert abs(live["frag_rate_mean"] - simulated["frag_rate_mean"]) <= 0.15
    assert live["reconfigurations"] > 0


GANG_NODES = 4
GANG_JOBS = 120
GANG_SHAPES = {"7g": 0.3, "2gpu": 0.1, "4gpu": 0.1, "8gpu": 0.15, "16gpu": 0.25, "24gpu": 0.1}
"""The large-training class on 4 x 8 GPUs: whole GPUs, gangs within a node and gangs across two or three."""


def _gang_workload(seed: int) -> Workload:
    """The synthetic four-class mix at full load of 4 x 8 GPUs, its large training jobs as ``GANG_SHAPES`` with a
    day's patience (as the gang benchmark's), so that gangs wait for GPUs rather than leave."""
    big = {"shapes": GANG_SHAPES, "share": 0.15, "patience_s": 86400.0}
    classes = tuple(msgspec.structs.replace(c, **big) if c.name == "large-training" else c for c in CLASSES)
    slices = GANG_NODES * 8 * default_geometry().model(MODEL).compute_slices
    return synthetic(np.random.default_rng(seed), jobs=GANG_JOBS, load=1.0, cluster_slices=slices,
                     classes=classes, mix="gangs-4x8")


def _gangs(workload: Workload, across: bool) -> set[str]:
    """The ids of the jobs of several whole GPUs (with ``across``: more than one node's)."""
    return {j.id for j in workload.jobs if j.demand.kind == "gpus" and j.demand.gpus > (8 if across else 1)}


def test_a_replayed_workload_with_gangs_across_nodes_is_accounted_for_and_matches_the_simulator(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    workload, skipped = replayer.on_mig_gpus(_gang_workload(seed=1))
    assert not skipped and len(_gangs(workload, across=True)) >= 5
    run = livekpis.simulated_run(workload, GANG_NODES, 8, MODEL)
    simulated = livekpis.comparable(run)
    assert run.reserved_idle_gpu_h > 0  # holds drain GPUs for the waiting gangs
    with running_stack(prefix, nats_url, redis_url, tmp_path, speedup=SPEEDUP, executors=GANG_NODES) as stack:
        outcomes, live, violations, (exits, busy_left), _ = asyncio.run(
            _replay_and_audit(stack, workload, n_gpus=GANG_NODES * 8))
    print(json.dumps({"live": live, "simulator": simulated}, indent=2))

    # every job, every gang included, accounted for exactly once; no slice double-booked; nothing left busy
    assert [j for j, o in outcomes.items() if o is None or o.state not in TERMINAL_STATES] == []
    per_job = Counter(e.job_id for e in exits)
    assert [j for j, k in per_job.items() if k > 1] == []
    finished = {j for j, o in outcomes.items() if o is not None and o.state == "finished"}
    assert finished == {e.job_id for e in exits if e.kind == "completed"}
    assert [str(v) for v in violations] == []
    assert busy_left == []

    # the gangs across nodes run live as in the simulator, and the KPIs agree, gangs' GPUs counted in the
    # utilisation
    across = _gangs(workload, across=True)
    assert len(across & finished) >= len(across) - 1 >= 4
    assert live["gangs"] == simulated["gangs"] == len(_gangs(workload, across=False))
    assert abs(live["gangs_completed"] - simulated["gangs_completed"]) <= 1
    sim_wait = float(simulated["gang_wait_mean_s"])
    assert sim_wait > 3600  # the gangs wait hours for their GPUs ...
    allowance = max(0.0, float(live["wait_mean_s"]) - float(simulated["wait_mean_s"]))
    # ... and as long live, within the pipeline's latency
    assert abs(live["gang_wait_mean_s"] - sim_wait) <= 0.15 * sim_wait + 1.5 * allowance
    n = GANG_JOBS
    assert abs(live["completed"] - simulated["completed"]) <= 0.05 * n
    for key in ("jct_mean_s", "jct_p50_s"):
        assert abs(live[key] - simulated[key]) <= 0.15 * simulated[key] + 1.5 * allowance, key
    assert abs(live["makespan_s"] - simulated["makespan_s"]) <= 0.10 * simulated["makespan_s"] + allowance
    assert abs(live["utilization"] - simulated["utilization"]) <= 0.15 * simulated["utilization"]
