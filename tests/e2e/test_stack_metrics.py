"""The metrics a running stack exports, read from each process's endpoint as Prometheus would: the names and
labels the dashboard and the alerts query, each process only its own, a dead letter counted by its reason; and
the liveness and readiness probes served beside them."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from stack_fixture import running_stack, settings_of

from migsched.stack import Stack
from shared.bus import JetStreamBus
from shared.events import Demand, JobSubmit
from shared.state import RedisState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
Series = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Series:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: Series = {}
    for fam in text_string_to_metric_families(body):
        # a family without series yet still names itself, with the names its series will have
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ("",))
        for suffix in suffixes:
            out.setdefault(fam.name + suffix, [])
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def probe(port: int, path: str) -> str:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5).read().decode()
    except urllib.error.HTTPError as exc:
        return f"{exc.code}: {exc.read().decode()}"


def total(series: Series, name: str, **labels: str) -> float:
    return sum(v for lab, v in series.get(name, ()) if all(lab.get(k) == x for k, x in labels.items()))


async def _run(stack: Stack) -> None:
    st = settings_of(stack)
    await stack.wait_ready(60)
    bus = await JetStreamBus.connect(st)
    state = RedisState.from_settings(st)
    try:
        now = time.time()
        for i, (profile, secs) in enumerate((("3g.20gb", 30.0), ("1g.5gb", 30.0))):
            await bus.publish(bus.subjects.jobs_submit, JobSubmit(
                id=f"s{i}", job_id=f"m{i}", tenant="team-a", demand=Demand(profile=profile),
                duration_hint_s=secs, submitted_at=now))
        # a submit the decoder refuses: dead-lettered with its reason
        await bus.publish_raw(bus.subjects.jobs_submit, json.dumps(
            {"v": 1, "id": "bad", "job_id": "bad", "demand": {"kind": "mig"}, "submitted_at": now}).encode(),
            {"Nats-Msg-Id": "bad"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = await state.jobs(["m0", "m1"])
            if all(j is not None and j.state == "running" for j in jobs):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # the gauges are set every 0.5 s here (MIGSCHED_MIRROR_REFRESH_S)
    finally:
        await state.close()
        await bus.close()


def test_a_running_stack_exports_what_the_dashboard_and_alerts_read(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = {"MIGSCHED_MIRROR_REFRESH_S": "0.5", "MIGSCHED_NODE_TIMEOUT_S": "5"}  # gauges set within a second
    with running_stack(prefix, nats_url, redis_url, tmp_path, executors=1, gpus="A100-40GB:2", env=env) as stack:
        asyncio.run(_run(stack))
        scraped = {name: scrape(port) for name, port in stack.metrics_ports.items()}
        probes = {name: [probe(port, p) for p in ("healthz", "readyz")] for name, port in stack.metrics_ports.items()}
    # every process serves its probes beside its metrics: live, and ready once started
    assert probes and all(answers == ["ok\n", "ok\n"] for answers in probes.values()), probes
    balancer, registry = scraped["balancer"], scraped["registry"]
    executor = next(v for k, v in scraped.items() if k.startswith("executor"))
    assert total(balancer, "migsched_decisions_total", outcome="placed") == 2
    assert total(balancer, "migsched_placements_total", tenant="team-a") == 2
    assert total(balancer, "migsched_admission_wait_seconds_count", tenant="team-a", priority_class="default") == 2
    assert total(balancer, "migsched_gpu_memory_slices", state="busy") == 5  # a 3g (4 slices) and a 1g
    assert total(balancer, "migsched_gpu_memory_slices") == 16
    assert len({lab["node"] for lab, _ in balancer["migsched_node_fragmentation_rate"]}) == 1  # one node
    assert total(balancer, "migsched_dead_letters_total", consumer="balancer-submit", reason="invalid") == 1
    assert total(registry, "migsched_nodes", state="up") == 1
    assert total(registry, "migsched_commands_total", kind="place", outcome="done") == 2
    assert total(executor, "migsched_executor_running_jobs") == 2
    # each process exports its own: no scheduling metric on the executor, no executor metric elsewhere
    assert "migsched_decisions_total" not in executor and "migsched_commands_total" not in executor
    assert not [n for n in balancer if n.startswith("migsched_executor_")]
    # every metric the dashboard and the alert rules read is exported by some process of the stack
    exported = {n for series in scraped.values() for n in series}
    dash = json.loads((ROOT / "deploy/grafana/migsched.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    rules = yaml.safe_load((ROOT / "deploy/prometheus/migsched-alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    read = {m for e in exprs for m in re.findall(r"\bmigsched_[a-z0-9_]+", e)}
    assert read - exported == set()
