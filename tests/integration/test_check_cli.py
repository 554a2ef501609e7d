"""``migsched check`` on a live Redis: a clean state passes, a corrupted one is reported with specific
messages and a non-zero exit, and it runs as the read-only ``audit`` Redis user (no SCRIPT LOAD, no write)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from migsched.commands import check
from services.common.testing import make_settings, private_state
from shared import access
from shared.events import Heartbeat, RunningSlot, Subjects, encode
from shared.localservers import start_redis
from shared.mig.geometry import default_geometry
from shared.state import RedisState, Reservation, StoredInstance, audit, shard_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

A100 = default_geometry().model("A100-40GB")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "redis"


def gpu(index: int) -> dict:  # type: ignore[type-arg]
    return {
        "id": f"n1/{index}",
        "index": index,
        "model": "A100-40GB",
        "mig": True,
        "healthy": True,
        "uuid": "",
        "instances": [],
    }


def res(job: str, profile: str, start: int, ver: int, gpu_id: str = "n1/0") -> Reservation:
    p = A100.profile(profile)
    inst = StoredInstance(
        id=f"{gpu_id}:{profile}@{start}:{job}",
        profile=profile,
        start=start,
        size=p.memory_slices,
        compute=p.compute_slices,
    )
    return Reservation(
        job_id=job,
        gpu_id=gpu_id,
        expected_ver=ver,
        instance=inst,
        action="create",
        max_count=p.max_count,
        spec=b"{}",
        submitted_at=1.0,
        reason="test",
    )


async def populate(st: RedisState) -> None:
    """Two GPUs, a running job, a placing job, a queued job and a finished one: a legal state."""
    now = time.time()
    await st.register_node("n1", [gpu(0), gpu(1)], now)
    assert (await st.reserve(res("run1", "3g.20gb", 4, ver=1), now)).ok
    assert await st.mark_running("run1", "n1/0:3g.20gb@4:run1", now) == "ok"
    assert (await st.reserve(res("plc1", "1g.5gb", 0, ver=1, gpu_id="n1/1"), now)).ok
    await st.enqueue("wait1", b"{}", 0, now, "no room", now)
    assert (await st.reserve(res("done1", "1g.5gb", 6, ver=2, gpu_id="n1/1"), now)).ok
    assert (await st.release("done1", "completed", "ok", now)).status == "ok"


@pytest.fixture
async def state(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[RedisState]:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    await populate(st)
    yield st
    await st.wipe()
    await st.close()


def run_cli_sync(redis_url: str, namespace: str, *extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(check.command, ["--redis-url", redis_url, "--namespace", namespace, *extra])
    return r.exit_code, r.output


async def run_cli(redis_url: str, namespace: str, *extra: str) -> tuple[int, str]:
    """The command in a thread: it runs its own event loop, as from a shell."""
    return await asyncio.to_thread(run_cli_sync, redis_url, namespace, *extra)


async def test_a_clean_state_passes_with_exit_zero(
    state: RedisState, redis_url: str, nats_url: str, prefix: str
) -> None:
    code, out = await run_cli(redis_url, prefix)
    assert code == 0, out
    assert "OK: every invariant holds" in out
    # and with the executor cross-check (no executor heartbeats in this namespace: nothing to contradict)
    code, out = await run_cli(redis_url, prefix, "--nats-url", nats_url, "--executors", "0.3")
    assert code == 0, out
    code, out = await run_cli(redis_url, prefix, "--json")
    assert code == 0 and json.loads(out) == {"namespace": prefix, "ok": True, "violations": []}


async def test_a_job_its_node_runs_on_another_instance_than_the_states_is_reported(
    state: RedisState, redis_url: str, nats_url: str, prefix: str
) -> None:
    import nats

    await asyncio.sleep(1.2)  # only what changed before the listening window (less a second) is judged
    nc = await nats.connect(nats_url)
    subject = Subjects(prefix).node_heartbeat("n1")

    async def beat() -> None:
        for seq in range(1, 1000):
            hb = Heartbeat(id=f"hb-{seq}", node="n1", seq=seq, at=time.time(), running=("run1",),
                           slots=(RunningSlot(job_id="run1", gpu_index=1, profile="3g.20gb", start=4),))
            await nc.publish(subject, encode(hb))
            await asyncio.sleep(0.1)

    beats = asyncio.create_task(beat())
    try:
        code, out = await run_cli(redis_url, prefix, "--nats-url", nats_url, "--executors", "0.6")
    finally:
        beats.cancel()
        await nc.close()
    assert code == 1, out
    assert "run1: n1 runs it on GPU 1 3g.20gb@4, but the state has it on n1/0:3g.20gb@4:run1" in out


async def test_an_overlap_written_by_hand_is_reported_by_gpu_and_instance(
    state: RedisState, redis_url: str, prefix: str
) -> None:
    k = state.keys(0)
    g = (await state.get_gpus(["n1/0"]))[0]
    assert g is not None
    raw = await state.redis.hget(k.gpu("n1/0"), "inst")
    insts = json.loads(raw)
    # a 2g.10gb at 4 lands on slices 4-5 of the running 3g.20gb at 4 (slices 4-7)
    insts.append(
        {
            "id": "n1/0:2g.10gb@4:intruder",
            "profile": "2g.10gb",
            "start": 4,
            "size": 2,
            "compute": 2,
            "state": "busy",
            "job": "intruder",
        }
    )
    await state.redis.hset(k.gpu("n1/0"), "inst", json.dumps(insts))
    code, out = await run_cli(redis_url, prefix)
    assert code == 1, out
    assert "overlap" in out and "n1/0: n1/0:2g.10gb@4:intruder overlaps another instance" in out
    # the intruder is busy for a job nobody knows: an orphan reservation
    assert "intruder (unknown job) which does not name it" in out
    code, out = await run_cli(redis_url, prefix, "--json")
    kinds = {v["kind"] for v in json.loads(out)["violations"]}
    assert code == 1 and kinds == {"overlap", "orphan"}


async def test_a_job_in_two_states_is_reported_with_the_state_it_claims(
    state: RedisState, redis_url: str, prefix: str
) -> None:
    k = state.keys(0)
    await state.redis.zadd(k.pending, {"run1": 1.0})  # running and queued
    await state.redis.zadd(k.placing, {"done1": 1.0})  # finished and placing
    await state.redis.zrem(k.placing, "plc1")  # placing but not in the placing set
    code, out = await run_cli(redis_url, prefix)
    assert code == 1, out
    assert "run1: state running but in the queue" in out
    assert "done1: state finished but in the placing set" in out
    assert "plc1: state placing but not in the placing set" in out
    assert "3 violation(s)" in out


async def test_counts_over_the_maximum_and_unknown_states_are_reported(
    state: RedisState, redis_url: str, prefix: str
) -> None:
    k = state.keys(0)
    await state.redis.hset(k.job("wait1"), "state", "limbo")
    sevens = [
        {"id": f"n1/1:7g.40gb@0:x{n}", "profile": "7g.40gb", "start": 0, "size": 8, "compute": 7}
        for n in range(2)
    ]
    await state.redis.hset(k.gpu("n1/1"), "inst", json.dumps(sevens))
    code, out = await run_cli(redis_url, prefix)
    assert code == 1
    assert "wait1: unknown state 'limbo'" in out
    assert "2 x 7g.40gb > max 1" in out


async def test_a_shard_without_a_node_while_another_has_one_is_reported_with_the_jobs_that_wait_there(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as st:
        now = time.time()
        await st.register_node("n1", [gpu(0)], now)
        home = shard_of("n1", 2)
        stranded = next(f"w{i}" for i in range(100) if shard_of(f"w{i}", 2) != home)
        await st.enqueue(stranded, b"{}", 0, now, "no room", now)
        code, out = await run_cli(redis_url, prefix, "--shards", "2")
        assert code == 1, out
        assert f"shard (1):\n    - shard {1 - home}: shard {1 - home} holds no GPU while shard(s) {home} do" in out
        assert "1 job(s) wait there" in out
        other = next(f"n{i}" for i in range(2, 100) if shard_of(f"n{i}", 2) != home)
        await st.register_node(other, [gpu(0) | {"id": f"{other}/0"}], now)  # a node there too: none stranded
        code, out = await run_cli(redis_url, prefix, "--shards", "2")
        assert code == 0, out


async def test_a_job_recorded_outside_its_home_shard_without_a_route_there_is_reported(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as st:
        now = time.time()
        for n in ("n1", next(f"n{i}" for i in range(2, 100) if shard_of(f"n{i}", 2) != shard_of("n1", 2))):
            await st.register_node(n, [gpu(0) | {"id": f"{n}/0"}], now)  # a node in each shard
        routed, lost = [j for j in (f"w{i}" for i in range(100)) if shard_of(j, 2) == 0][:2]
        await st.route({routed: 1}, now)
        await st.enqueue(routed, b"{}", 0, now, "no room", now)
        code, out = await run_cli(redis_url, prefix, "--shards", "2")
        assert code == 0, out  # routed by its home, recorded where the route says
        await st.redis.hset(st.keys(1).job(lost), mapping={"state": "pending", "at": now})
        await st.redis.sadd(st.keys(1).jobs, lost)
        await st.redis.zadd(st.keys(1).pending, {lost: now})  # written there by hand: no route names shard 1
        code, out = await run_cli(redis_url, prefix, "--shards", "2")
        assert code == 1, out
        assert (f"{lost}: recorded in shard 1, but its home shard 0 has no route for it: its transitions go to "
                "shard 0") in out
        assert routed not in out


async def test_a_block_whose_nodes_live_in_two_shards_is_reported_with_them(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as st:
        now = time.time()
        home = await st.block_shard("b")
        await st.register_node("n1", [gpu(0)], now, labels={"block": "b"})
        code, out = await run_cli(redis_url, prefix, "--shards", "2")
        assert "block b" not in out, out
        # the block map names the other shard now (as after a change of the shard count): the next node of the
        # block registers there
        await st.redis.hset(st.blocks_key, "b", 1 - home)
        await st.register_node("n2", [gpu(0) | {"id": "n2/0"}], now, labels={"block": "b"})
        code, out = await run_cli(redis_url, prefix, "--shards", "2")
        assert code == 1, out
        assert f"block b: its nodes live in shards {min(home, 1 - home)} (" in out
        assert "(n1)" in out and "(n2)" in out


async def test_a_tenants_usage_counter_that_drifted_from_its_jobs_charges_is_reported_and_recounted(
    state: RedisState, redis_url: str, prefix: str
) -> None:
    import msgspec

    (g,) = await state.get_gpus(["n1/0"])
    charged = msgspec.structs.replace(res("team1", "1g.5gb", 0, ver=g.ver), tenant="team",
                                      usage={"compute_slices": 1.0})
    assert (await state.reserve(charged, time.time())).ok
    code, out = await run_cli(redis_url, prefix)
    assert code == 0, out
    await state.redis.hincrbyfloat(state.keys(0).usage, "team\tcompute_slices", 2.0)
    code, out = await run_cli(redis_url, prefix)
    assert code == 1
    assert "team: counts 3 compute_slices; its active jobs are charged 1" in out
    # the repair: the counters rebuilt from the active jobs' charges
    from migsched.commands import quota

    r = await asyncio.to_thread(CliRunner().invoke, quota.command,
                                ["recount", "--redis-url", redis_url, "--namespace", prefix])
    assert r.exit_code == 0 and "shard 0: 1 active job(s) of a tenant counted" in r.output, r.output
    code, out = await run_cli(redis_url, prefix)
    assert code == 0, out


def test_an_unreachable_redis_exits_two_with_a_clear_message() -> None:
    code, out = run_cli_sync("redis://127.0.0.1:1/0", "nowhere")
    assert code == 2
    assert "cannot reach Redis" in out


async def test_it_runs_as_the_read_only_audit_user(tmp_path: Path, prefix: str) -> None:
    secrets = access.generate_secrets()
    acl = tmp_path / "users.acl"
    acl.write_text(access.render_redis(secrets, key_prefix="{" + prefix + ":"))
    server = start_redis(config=DEPLOY / "redis.conf", aclfile=acl)
    try:
        host = server.url.removeprefix("redis://")
        admin = f"redis://admin:{secrets['MIGSCHED_REDIS_PASSWORD_ADMIN']}@{host}"
        audit_url = f"redis://audit:{secrets['MIGSCHED_REDIS_PASSWORD_AUDIT']}@{host}"
        st = RedisState.from_settings(make_settings(prefix, "nats://127.0.0.1:1", admin))
        try:
            await populate(st)
            await st.redis.script_flush()  # nothing cached: the audit must not need SCRIPT LOAD
            code, out = await run_cli(audit_url, prefix)
            assert code == 0, out
            await st.redis.zadd(st.keys(0).pending, {"run1": 1.0})
            code, out = await run_cli(audit_url, prefix)
            assert code == 1 and "run1: state running but in the queue" in out
        finally:
            await st.close()
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["re-registers without its instances", "is lost"])
async def test_a_moving_job_requeued_by_its_node_leaves_no_instance_held(
    prefix: str, nats_url: str, redis_url: str, how: str
) -> None:
    """Regression (lua/node.lua): the other instance of a move used to stay held by the re-queued job. On the
    node itself it idles at once; on another node, where the job's copy may run, it stays ``retiring`` until that
    node confirms a stop."""
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url))
    try:
        now = time.time()
        await st.register_node("n1", [gpu(0), gpu(1)], now)
        other = [{**gpu(0), "id": "n2/0"}]
        await st.register_node("n2", other, now)
        assert (await st.reserve(res("mv", "1g.5gb", 6, ver=1), now)).ok
        assert await st.mark_running("mv", "n1/0:1g.5gb@6:mv", now) == "ok"
        p = A100.profile("1g.5gb")
        for dst, node_gpu in (("n1/1", "n1"), ("n2/0", "n2")):
            target = StoredInstance(id=f"{dst}:1g.5gb@0:mv.x", profile="1g.5gb", start=0, size=1, compute=1)
            b = st.batch()
            b.migrate_reserve("mv", "n1/0:1g.5gb@6:mv", dst, 1, target, (), p.max_count, 0.0, "test", now)
            status, _ = (await b.run())[0]
            assert status == "ok", (status, node_gpu)
            assert (await st.job("mv")).state == "migrating"  # type: ignore[union-attr]
            if how == "is lost":
                out = await st.node_lost("n1", now, "test")
            else:
                out = await st.register_node("n1", [gpu(0), gpu(1)], now)
            assert (await st.job("mv")).state == "pending"  # type: ignore[union-attr]
            assert await audit_ok(st), [str(v) for v in await audit(st, default_geometry())]
            held = [(g.id, i.id, i.state) for g in await st.load_gpus() for i in g.instances
                    if i.job == "mv" and i.state != "idle"]
            if node_gpu == "n2":
                assert held == [("n2/0", target.id, "retiring")]
                assert [tuple(x) for x in out["stops"]] == [("mv", "n2/0", target.id, "n2")]
                assert (await st.node_stopped("n2", "mv", now))["gpus"] == ["n2/0"]
            else:
                assert held == []
            for g in await st.load_gpus():
                assert all(i.job != "mv" or i.state == "idle" for i in g.instances), g
            # back to running on n1 for the next round
            await st.register_node("n1", [gpu(0), gpu(1)], now)
            b = st.batch()
            b.settle("mv", "cancelled", "next round", now, ("pending",))
            await b.run()
            await st.redis.delete(st.keys(0).job("mv"))
            await st.redis.srem(st.keys(0).jobs, "mv")
            g0 = (await st.get_gpus(["n1/0"]))[0]
            assert g0 is not None
            r = res("mv", "1g.5gb", 6, ver=g0.ver)
            assert (await st.reserve(r, now)).ok
            assert await st.mark_running("mv", "n1/0:1g.5gb@6:mv", now) == "ok"
    finally:
        await st.wipe()
        await st.close()


async def audit_ok(st: RedisState) -> bool:
    return not await audit(st, default_geometry())
