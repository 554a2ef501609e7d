"""Several simulated nodes in one executor process (``MIGSCHED_NODES``), against a real NATS: they share one
connection, each node registers its own GPUs, reads only its own commands and reports on its own subjects, and
one stop ends all."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.executor.config import ExecutorError, hosted_nodes
from services.executor.service import ExecutorSettings, serve
from shared.bus import JetStreamBus
from shared.events import CmdDone, Command, Registered, decode, now
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]
A100 = default_geometry().model("A100-40GB")


def settings(nats_url: str, prefix: str, **kw: Any) -> ExecutorSettings:
    base: dict[str, Any] = dict(env={}, nats_url=nats_url, namespace=prefix, stream_storage="memory",
                                executor_gpus="A100-40GB:2", executor_reconfig_latency_s=0.0, heartbeat_s=0.2,
                                metrics_port=0, fetch_timeout_s=0.05)
    return load(ExecutorSettings, **{**base, **kw})


def place(node: str, job: str) -> Command:
    p = A100.profile("1g.5gb")
    iid = f"{node}/0:1g.5gb@0:{job}"
    ops = tuple(MigOp(kind=k, gpu_id=f"{node}/0", instance_id=iid, profile=p.name, profile_id=p.profile_id,
                      start=0, size=p.memory_slices) for k in ("create_gi", "create_ci"))
    return Command(id=f"place:{job}:1", cmd_id=f"place:{job}:1", kind="place", node=node, gpu_id=f"{node}/0",
                   gpu_index=0, ops=ops, instance_id=iid, job_id=job, duration_s=3600.0, at=now())


async def test_nodes_hosted_in_one_process_share_one_connection_and_each_answers_only_its_own_commands(
    nats_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = settings(nats_url, prefix, nodes="h1,h2,h3")
    bus = await JetStreamBus.connect(st)
    await bus.ensure_streams()
    opened: list[str] = []
    connect = JetStreamBus.connect

    async def counted(settings: Any, name: str = "migsched", **options: Any) -> JetStreamBus:
        opened.append(name)
        return await connect(settings, name=name, **options)

    monkeypatch.setattr(JetStreamBus, "connect", counted)
    seen: list[tuple[str, Any]] = []

    async def on_msg(m: Any) -> None:
        seen.append((m.subject, decode(m.subject, m.data, bus.subjects)))

    sub = await bus.nc.subscribe(f"{bus.subjects.root}node.*.report", cb=on_msg)
    stop = asyncio.Event()
    host = asyncio.create_task(serve(st, stop=stop))

    def reports(kind: type) -> list[tuple[str, Any]]:
        return [(s, m) for s, m in seen if isinstance(m, kind)]

    async def until(pred: Any) -> None:
        while not pred():
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(until(lambda: len(reports(Registered)) == 3), 10)
        assert sorted(m.node for _, m in reports(Registered)) == ["h1", "h2", "h3"]
        assert all(len(m.gpus) == 2 for _, m in reports(Registered))
        assert opened == ["executors"]  # one connection for the three nodes
        for node in ("h1", "h3"):
            await bus.publish(bus.subjects.cmd(node), place(node, f"job-{node}"))
        await asyncio.wait_for(until(lambda: len(reports(CmdDone)) == 2), 10)
        done = {m.node: (s, m.job_id) for s, m in reports(CmdDone)}
        assert done == {n: (bus.subjects.node_report(n), f"job-{n}") for n in ("h1", "h3")}
        stop.set()
        await asyncio.wait_for(host, 10)
    finally:
        stop.set()
        await sub.unsubscribe()
        await bus.delete_streams()
        await bus.close()


def test_only_simulated_nodes_can_share_a_process() -> None:
    assert hosted_nodes(load(ExecutorSettings, env={}, node="solo")) == ["solo"]
    assert hosted_nodes(load(ExecutorSettings, env={}, nodes="a, b")) == ["a", "b"]
    with pytest.raises(ExecutorError, match="simulated nodes only"):
        hosted_nodes(load(ExecutorSettings, env={}, nodes="a,b", executor_backend="nvml"))
    with pytest.raises(ExecutorError, match="distinct"):
        hosted_nodes(load(ExecutorSettings, env={}, nodes="a,a"))


def test_the_stack_runs_its_nodes_a_few_per_executor_process(tmp_path: Any) -> None:
    from migsched.stack import Stack, StackConfig

    stack = Stack(StackConfig(executors=5, nodes_per_executor=2, run_dir=tmp_path, metrics=False))
    stack.nats = stack.redis = type("Server", (), {"url": "x://127.0.0.1:1"})()  # type: ignore[assignment]
    execs = [p for p in stack.plan() if p.name.startswith("executor")]
    assert [p.env["MIGSCHED_NODES"] for p in execs] == ["gpu-node-0,gpu-node-1", "gpu-node-2,gpu-node-3", ""]
    assert [p.env["MIGSCHED_NODE"] for p in execs] == ["gpu-node-0", "gpu-node-2", "gpu-node-4"]
    assert [p.name for p in execs] == ["executor-gpu-node-0..gpu-node-1", "executor-gpu-node-2..gpu-node-3",
                                       "executor-gpu-node-4"]
    assert stack.nodes() == [f"gpu-node-{i}" for i in range(5)]  # readiness still waits for every node


def test_the_stack_spreads_its_executors_over_topology_blocks_in_order(tmp_path: Any) -> None:
    from migsched.stack import Stack, StackConfig

    stack = Stack(StackConfig(executors=5, blocks=2, run_dir=tmp_path, metrics=False, env={"MIGSCHED_SHARDS": "2"}))
    stack.nats = stack.redis = type("Server", (), {"url": "x://127.0.0.1:1"})()  # type: ignore[assignment]
    execs = [p for p in stack.plan() if p.name.startswith("executor")]
    assert [p.env["MIGSCHED_NODE_LABELS"] for p in execs] == ["block=b0"] * 3 + ["block=b1"] * 2
    assert stack.client_settings().shards == 2  # the verbs it prints read both shards
    unlabelled = Stack(StackConfig(executors=2, run_dir=tmp_path, metrics=False))
    unlabelled.nats = unlabelled.redis = stack.nats
    assert all("MIGSCHED_NODE_LABELS" not in p.env for p in unlabelled.plan())
