"""The straggler dump: what Redis holds about each job the load recorder gave up on, and which transition it lacks.

The verdicts are pure; the Redis read runs against a real Redis (the integration marker), on jobs put there by
the stack's own Lua transitions, so the key layout read is the one the services write.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from load.stragglers import note, snapshot, verdict, write
from services.common.testing import make_settings
from shared.mig.geometry import default_geometry
from shared.state import RedisState, Reservation, StoredInstance
from shared.state.keys import Keys
from shared.state.sharding import shard_of

MS = 1_000_000
A100 = default_geometry().model("A100-40GB")


@pytest.mark.unit
def test_a_queued_job_is_backlog_and_a_finished_one_had_its_exit_unseen() -> None:
    assert "backlog" in verdict({}, ["exit"], {"job": {"state": "pending"}, "pending": True})
    assert "nothing will ever place it" in verdict({}, ["exit"], {"job": {"state": "pending"}, "pending": False})
    assert "not seen by the recorder" in verdict({}, ["exit"], {"job": {"state": "finished"}, "done": True})
    assert "unknown to Redis" in verdict({}, ["command", "exit"], {"job": {}})
    # a placement failed max_attempts times: terminal, but never ran, so no exit will ever come
    failed = {"job": {"state": "failed"}, "done": True, "history": [
        {"from": "pending", "to": "placing", "reason": "placed"},
        {"from": "placing", "to": "failed", "reason": "executor on n1 failed place: overlap"}]}
    assert verdict({}, ["exit"], failed).startswith("failed from placing (executor on n1 failed place: overlap)")


@pytest.mark.unit
def test_a_placing_job_names_its_command_in_flight_or_the_missing_one() -> None:
    cmd = {"place:j:1": {"node": "n1", "kind": "place", "job": "j"}}
    assert "place:j:1 in flight" in verdict({}, ["exit"], {"job": {"state": "placing"}, "placing": True,
                                                          "cmds": cmd})
    assert "not handled by the node registry" in verdict({}, ["exit"], {"job": {"state": "placing"},
                                                                      "placing": True, "cmds": {}})
    assert "no job_exit applied" in verdict({}, ["exit"], {"job": {"state": "running"}})


@pytest.mark.unit
def test_without_a_redis_url_only_the_recorded_stages_are_written(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    monkeypatch.delenv("MIGSCHED_REDIS_URL", raising=False)
    out = tmp_path / "s.json"
    data = asyncio.run(write(out, {"r-1": {"submit": 5 * MS, "command": 9 * MS}}, namespace="x", final="exit",
                             watched=("command", "exit")))
    on_disk = json.loads(out.read_text())
    assert on_disk["count"] == 1 and on_disk["jobs"]["r-1"] == {"stages_ms": {"submit": 0.0, "command": 4.0},
                                                                "missing": ["exit"]}
    assert "no Redis state read" in note(data, out)


def _res(job: str, start: int, ver: int, node: str = "n1") -> Reservation:
    p = A100.profile("1g.5gb")
    inst = StoredInstance(id=f"{node}/0:1g.5gb@{start}:{job}", profile="1g.5gb", start=start,
                          size=p.memory_slices, compute=p.compute_slices)
    return Reservation(job_id=job, gpu_id=f"{node}/0", expected_ver=ver, instance=inst, action="create", destroy=(),
                       max_count=p.max_count, spec=b'{"job_id": "%s"}' % job.encode(), prio=0, submitted_at=1.0,
                       reason="test")


@pytest.fixture
async def state(prefix: str, redis_url: str, nats_url: str) -> AsyncIterator[RedisState]:
    st = RedisState.from_settings(make_settings(prefix, nats_url, redis_url, shards=2))
    for node in ("n1", "n4"):  # shards 0 and 1 of 2: a job's GPU lives in the job's shard
        gpu = {"id": f"{node}/0", "index": 0, "model": "A100-40GB", "mig": True, "healthy": True, "uuid": "",
               "instances": []}
        await st.register_node(node, [gpu], time.time())
    yield st
    await st.wipe()
    await st.close()


@pytest.mark.integration
@pytest.mark.timeout(30)
async def test_each_straggler_is_written_with_its_hash_history_queues_and_commands(
    state: RedisState, prefix: str, redis_url: str, tmp_path: Path
) -> None:
    now = time.time()
    run = "r"
    # one job per state the dump must tell apart, on both shards (crc32(id) % 2: r-placing and r-never in 1)
    assert await state.enqueue(f"{run}-queued", b"{}", 0, 1.0, "no room", now) == "queued"
    assert (await state.reserve(_res(f"{run}-placing", 6, 1, node="n4"), now)).ok
    b = state.batch()
    b.track_command(state.job_keys(f"{run}-placing").shard, f"place:{run}-placing:1",
                    {"node": "n4", "kind": "place", "job": f"{run}-placing", "gpu": "n4/0", "at": now})
    await b.run()
    assert (await state.reserve(_res(f"{run}-ran", 5, 1), now)).ok
    assert await state.mark_running(f"{run}-ran", f"n1/0:1g.5gb@5:{run}-ran", now) == "ok"
    assert (await state.release(f"{run}-ran", "completed", "exit 0", now, f"n1/0:1g.5gb@5:{run}-ran")).status == "ok"
    timelines = {j: {"submit": 10 * MS, "command": 12 * MS} for j in (f"{run}-placing", f"{run}-ran")}
    timelines[f"{run}-queued"] = {"submit": 10 * MS}
    timelines[f"{run}-never"] = {"submit": 10 * MS}
    out = tmp_path / "s.json"
    data = await write(out, timelines, namespace=prefix, final="exit", watched=("command", "exit"),
                       redis_url=redis_url, shards=2)
    assert json.loads(out.read_text()) == json.loads(json.dumps(data))
    assert data["count"] == 4 and data["states"] == {"pending": 1, "placing": 1, "finished": 1, "absent": 1}
    jobs = data["jobs"]
    q, p, f, n = (jobs[f"{run}-{x}"] for x in ("queued", "placing", "ran", "never"))
    assert q["pending"] and not q["placing"] and q["missing"] == ["command", "exit"] and "backlog" in q["verdict"]
    assert p["placing"] and list(p["cmds"]) == [f"place:{run}-placing:1"] and p["job"]["gpu"] == "n4/0"
    assert p["job"]["spec"] == {"job_id": f"{run}-placing"} and p["stages_ms"] == {"submit": 0.0, "command": 2.0}
    assert [h["to"] for h in f["history"]] == ["placing", "running", "finished"] and f["done"]
    assert "hn" not in f["job"] and "h1" not in f["job"] and f["job"]["state"] == "finished"  # listed once
    assert "not seen by the recorder" in f["verdict"]
    assert n["job"] == {} and n["history"] == [] and "unknown to Redis" in n["verdict"]
    # a stalled stack leaves thousands short: every state is counted, the queued ones are listed last
    few = await snapshot(state.redis, prefix, 2, timelines, ("command", "exit"), limit=3)
    assert few["count"] == 4 and few["listed"] == 3 and few["states"] == data["states"]
    assert f"{run}-queued" not in few["jobs"]
    line = note(data, out)
    assert line.startswith("stragglers (4) by Redis state: ") and line.endswith(f"; details in {out}")
    assert all(f"{st} 1" in line for st in ("pending", "placing", "finished", "absent"))


@pytest.mark.integration
@pytest.mark.timeout(30)
async def test_the_dump_reads_the_job_in_its_own_namespace_and_shard(prefix: str, redis_url: str) -> None:
    assert shard_of("r-x", 2) == 1
    right = Keys(prefix, 1)
    decoys = [Keys("other" + prefix, 1).job("r-x"), Keys(prefix, 0).job("r-x")]  # another namespace, shard
    client = aioredis.from_url(redis_url)
    try:
        await client.hset(right.job("r-x"), mapping={"state": "running", "node": "n4"})
        await client.hset(right.cmds, "stop:r-x:1", json.dumps({"node": "n4", "kind": "stop", "job": "r-x"}))
        await client.hset(right.cmds, "place:r-y:0", json.dumps({"node": "n4", "kind": "place", "job": "r-y"}))
        for k in decoys:
            await client.hset(k, mapping={"state": "finished"})
        data = await snapshot(client, prefix, 2, {"r-x": {"submit": 0}}, ("exit",))
        assert data["states"] == {"running": 1}
        assert list(data["jobs"]["r-x"]["cmds"]) == ["stop:r-x:1"]
        assert "no job_exit applied" in data["jobs"]["r-x"]["verdict"]
    finally:
        await client.delete(right.job("r-x"), right.cmds, *decoys)
        await client.aclose()
