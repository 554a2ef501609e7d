"""The CLI's traps, on real NATS + Redis: a submit nobody would consume, ``--wait`` on a job that did not
finish, a cancel of an unknown id, and the commands ``up`` prints."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner, Result

from migsched.cli import main
from migsched.commands.up import next_steps
from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from shared.events import JobSubmit
from tests.integration.test_plain_gpus_flow import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


class Cli:
    def __init__(self, ns: Namespace, nats_url: str, redis_url: str) -> None:
        self.ns, self.where = ns, ["--nats-url", nats_url, "--redis-url", redis_url,
                                   "--namespace", ns.settings.namespace]

    async def __call__(self, verb: str, *args: str) -> Result:
        # the verbs run their own event loop: in a thread, beside this test's
        return await asyncio.to_thread(CliRunner().invoke, main, [verb, *self.where, *args])

    async def state(self, job: str) -> str | None:
        rec = await self.ns.state.job(job)
        return None if rec is None else str(rec.state)


@pytest.fixture
async def bare(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[Cli]:
    """A namespace with its streams and no service."""
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        yield Cli(ns, nats_url, redis_url)


@pytest.fixture
async def live(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[tuple[Cli, ScriptedExecutor]]:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        assert await until(lambda: _has_gpus(stack))
        yield Cli(ns, nats_url, redis_url), ex
        await ex.stop()
        await stack.stop()


async def _has_gpus(stack: Stack) -> bool:
    return len(stack.balancer.mirrors[0]) >= 1


async def test_a_submit_that_no_running_service_would_consume_publishes_nothing_and_exits_non_zero(bare: Cli) -> None:
    r = await bare("submit", "--profile", "1g", "--job-id", "lost")
    assert r.exit_code == 4
    assert "no running service consumes submits" in r.stderr and bare.ns.settings.namespace in r.stderr
    info = await bare.ns.bus.js.stream_info(bare.ns.bus.subjects.stream_jobs)
    assert info.state.messages == 0  # nothing was queued for nobody
    queued = await bare("submit", "--profile", "1g", "--job-id", "later", "--anyway")
    assert queued.exit_code == 0 and queued.stdout.strip() == "later"


async def test_a_submit_carries_its_variables_and_run_as_user_to_the_published_job(bare: Cli) -> None:
    r = await bare("submit", "--profile", "1g", "--job-id", "env", "--anyway", "--env", "NCCL_DEBUG=INFO",
                   "--env", "EMPTY=", "--run-as", "trainer", "--", "python3", "train.py")
    assert r.exit_code == 0, r.output
    subjects = bare.ns.bus.subjects
    raw = await bare.ns.bus.js.get_last_msg(subjects.stream_jobs, subjects.jobs_submit)
    job = msgspec.json.decode(raw.data, type=JobSubmit)
    assert (job.job_id, dict(job.workload.env), job.workload.run_as) == (
        "env", {"NCCL_DEBUG": "INFO", "EMPTY": ""}, "trainer"
    )
    assert job.workload.argv == ("python3", "train.py")


async def test_submit_wait_exits_zero_only_for_a_finished_job_and_prints_the_reason_otherwise(
    live: tuple[Cli, ScriptedExecutor],
) -> None:
    cli, ex = live
    rejected = await cli("submit", "--gpus", "2", "--patience", "0.5", "--job-id", "too-big", "--wait", "30")
    assert rejected.exit_code == 1, rejected.output
    assert rejected.stdout.splitlines()[-1].startswith("rejected: ") and len(rejected.stdout.splitlines()[-1]) > 10

    async def finish() -> None:
        assert await until(lambda: _is(cli, "ok", "running"))
        await ex.exit(["ok"])

    finisher = asyncio.create_task(finish())
    done = await cli("submit", "--profile", "1g", "--job-id", "ok", "--wait", "30")
    await finisher
    assert done.exit_code == 0 and done.stdout.splitlines() == ["ok", "finished"]

    async def fail() -> None:
        assert await until(lambda: _is(cli, "bad", "running"))
        await ex.exit(["bad"], kind="failed")

    failer = asyncio.create_task(fail())
    failed = await cli("submit", "--profile", "1g", "--job-id", "bad", "--wait", "30")
    await failer
    assert failed.exit_code == 1 and failed.stdout.splitlines()[-1].startswith("failed: ")


async def test_a_wait_that_runs_out_says_so_and_exits_three(live: tuple[Cli, ScriptedExecutor]) -> None:
    cli, _ = live
    r = await cli("submit", "--profile", "1g", "--job-id", "slow", "--wait", "0.5")
    assert r.exit_code == 3 and "did not reach" in r.stderr


async def test_a_cancel_of_an_unknown_job_says_so_exits_non_zero_and_leaves_the_id_usable(
    live: tuple[Cli, ScriptedExecutor],
) -> None:
    cli, _ = live
    r = await cli("cancel", "ghost")
    assert r.exit_code == 1 and "unknown job: ghost" in r.stderr
    sub = await cli("submit", "--profile", "1g", "--job-id", "ghost")
    assert sub.exit_code == 0
    assert await until(lambda: _is(cli, "ghost", "running"))  # no tombstone swallowed the submit
    again = await cli("cancel", "ghost")
    assert again.exit_code == 0 and "cancel requested: ghost" in again.stdout
    assert await until(lambda: _is(cli, "ghost", "cancelled"))
    ended = await cli("cancel", "ghost")
    assert ended.exit_code == 0 and "already cancelled: ghost" in ended.stdout


async def _is(cli: Cli, job: str, state: str) -> bool:
    return await cli.state(job) == state


def test_up_prints_its_commands_with_its_namespace_and_servers() -> None:
    text = next_steps("demo-1a2b3c", "nats://127.0.0.1:4222", "redis://127.0.0.1:6390/0")
    assert "migsched submit --namespace demo-1a2b3c --redis-url redis://127.0.0.1:6390/0 --profile 3g" in text
    assert "migsched status --namespace demo-1a2b3c --redis-url redis://127.0.0.1:6390/0" in text
    assert "export MIGSCHED_NAMESPACE=demo-1a2b3c" in text
    plain = next_steps("", "nats://127.0.0.1:4222", "redis://127.0.0.1:6379/0")
    assert "`migsched submit --profile 3g --duration 60`" in plain and "export" not in plain
    default = ("", "nats://127.0.0.1:4222", "redis://127.0.0.1:6379/0")
    assert "`migsched submit --gpus 1 --duration 60`" in next_steps(*default, "A100-40GB:8:whole")
    assert "`migsched submit --shared --duration 60`" in next_steps(*default, "A100-40GB:4:whole,H100-80GB:2:shared=4")


async def test_dlq_lists_a_refused_message_with_its_reason_and_replays_one_onto_its_subject(
    live: tuple[Cli, ScriptedExecutor],
) -> None:
    cli, _ = live
    bus = cli.ns.bus
    empty = await cli("dlq")  # the stream exists and never held a message: it reports sequence 0
    assert empty.exit_code == 0 and "no dead letters" in empty.stdout, empty.output
    bad = b'{"v":1,"id":"s-bad","job_id":"bad","demand":{"kind":"mig"},"submitted_at":1.0}'
    await bus.js.publish(bus.subjects.jobs_submit, bad, headers={"Nats-Msg-Id": "s-bad"})

    async def listed() -> bool:
        r = await cli("dlq", "list", "--json")
        return r.exit_code == 0 and "s-bad" in r.stdout

    assert await until(listed)
    (line,) = [json.loads(x) for x in (await cli("dlq", "list", "--json")).stdout.splitlines()
               if "s-bad" in x]
    assert line["subject"] == bus.subjects.jobs_submit and "demand" in line["reason"] and line["consumer"]
    text = (await cli("dlq")).stdout
    assert str(line["seq"]) in text and line["reason"] in text
    # a message a consumer refused before it was fixed: put back on its subject, it runs
    good = b'{"v":1,"id":"s-good","job_id":"good","demand":{"kind":"mig","profile":"1g"},"submitted_at":1.0}'
    ack = await bus.js.publish(bus.subjects.dlq(bus.subjects.jobs_submit), good, headers={
        "Nats-Msg-Id": "dlq:test:1", "Migsched-Original-Subject": bus.subjects.jobs_submit,
        "Migsched-Error": "refused before the fix"})
    r = await cli("dlq", "replay", str(ack.seq))
    assert r.exit_code == 0 and bus.subjects.jobs_submit in r.stdout
    assert await until(lambda: _is(cli, "good", "running"))
    left = (await cli("dlq", "list", "--json")).stdout.splitlines()
    assert ack.seq not in {json.loads(x)["seq"] for x in left}  # replayed: gone from the dead-letter stream
    missing = await cli("dlq", "replay", str(ack.seq))
    assert missing.exit_code == 1 and f"no dead letter with sequence {ack.seq}" in missing.stderr


async def test_describe_shows_why_a_job_waits_and_every_transition_with_its_reason(
    live: tuple[Cli, ScriptedExecutor],
) -> None:
    cli, _ = live
    assert (await cli("submit", "--profile", "1g", "--job-id", "here", "--tenant", "team-a")).exit_code == 0
    assert (await cli("submit", "--profile", "7g", "--job-id", "waits")).exit_code == 0  # the 1g is in the way
    assert await until(lambda: _is(cli, "here", "running"))
    assert await until(lambda: _is(cli, "waits", "pending"))
    placed = await cli("describe", "here")
    assert placed.exit_code == 0, placed.output
    text = placed.stdout
    assert "job here: running" in text and "asks 1g for tenant team-a" in text and "holds on n1: n1/0" in text
    assert "-> placing: here -> n1/0 1g" in text and "placing -> running" in text
    pending = (await cli("describe", "waits")).stdout
    assert "job waits: pending" in pending and "why it waits: cannot place" in pending
    as_json = json.loads((await cli("describe", "waits", "--json")).stdout)
    assert as_json["record"]["state"] == "pending" and "7g" in as_json["spec"]["demand"]["profile"]
    assert [h["to"] for h in as_json["history"]][:1] == ["pending"]
    unknown = await cli("describe", "nobody")
    assert unknown.exit_code == 1 and "unknown job: nobody" in unknown.stderr


async def test_quota_show_reads_each_tenants_usage_live_from_the_cluster(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    tenancy = tmp_path / "tenancy.toml"
    tenancy.write_text('[tenants.team]\nquota = { "compute_slices" = 7 }\n')
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url, tenancy_file=str(tenancy))
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=1)
        await ex.start()
        try:
            cli = Cli(ns, nats_url, redis_url)
            assert await until(lambda: _has_gpus(stack))
            assert (await cli("submit", "--profile", "3g", "--tenant", "team", "--job-id", "q1")).exit_code == 0
            assert await until(lambda: _is(cli, "q1", "running"))
            r = await asyncio.to_thread(CliRunner().invoke, main, ["quota", "show", *cli.where, str(tenancy),
                                                                   "--json"])
            assert r.exit_code == 0, r.output
            rows = {(x["tenant"], x["resource"]): x for x in json.loads(r.stdout)}
            assert rows[("team", "compute_slices")]["used"] == 3 and rows[("team", "compute_slices")]["quota"] == 7
        finally:
            await ex.stop()
            await stack.stop()


async def test_submit_carries_a_gangs_topology_and_launch_and_a_gang_too_big_is_rejected(
    live: tuple[Cli, ScriptedExecutor],
) -> None:
    cli, _ = live
    res = await cli("submit", "--gpus", "2", "--topology", "block:required", "--launch", "per-node", "--job-id",
                    "big", "--wait", "10", "--", "train.py")
    assert res.exit_code == 1 and "rejected: needs 2 GPUs; the cluster has 1" in res.stdout


def test_a_gangs_topology_and_launch_reach_the_submit_message() -> None:
    from migsched.commands.submit import _topology
    from shared.client import MigschedClient

    msg = MigschedClient.job(job_id="g", gpus=64, topology=_topology("rack:required"), launch="per-node")
    assert (msg.topology.level, msg.topology.mode) == ("rack", "required")  # type: ignore[union-attr]
    assert msg.workload.launch == "per-node" and _topology("block").mode == "preferred"  # type: ignore[union-attr]


async def test_status_lists_one_row_per_node_on_request_and_only_the_nodes_asked_for(
    live: tuple[Cli, ScriptedExecutor],
) -> None:
    cli, _ = live
    assert (await cli("submit", "--profile", "3g", "--job-id", "one")).exit_code == 0
    assert await until(lambda: _is(cli, "one", "running"))
    by_node = await cli("status", "--by-node")
    assert by_node.exit_code == 0, by_node.output
    assert "1 GPUs on 1 nodes" in by_node.stdout and "n1/0 A100-40GB" not in by_node.stdout
    assert "│ n1 " in by_node.stdout and "▒" in by_node.stdout  # a 3g: the GPU partly used
    only = await cli("status", "--node", "n1")
    assert only.exit_code == 0 and "n1/0 A100-40GB" in only.stdout, only.output
    unknown = await cli("status", "--node", "n9")
    assert unknown.exit_code == 2 and "no node n9 in this cluster" in unknown.output
