"""Handler-level fuzzing against a real in-process stack (balancer + registry + a scripted executor on the
real NATS and Redis of a private namespace).

A few hundred malformed and adversarial messages are published on the external subjects (submits, cancels,
node reports and heartbeats) and on the internal ones a compromised peer could write to (``jobs.exit``,
``cmd.<node>``), interleaved with real jobs. Each malformed one must land once on
``dlq.<subject>`` with a non-empty ``Migsched-Error`` naming what is wrong; valid-but-nonsensical reports (an
exit of a job never placed, a result for a command never sent) must be absorbed; the services must stay alive
and keep placing; and the state must be clean (``audit()``), with every real job accounted for.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from services.common.testing import Namespace, ScriptedExecutor, Stack, make_settings
from services.common.testing import until as wait_for
from shared.events import (
    CmdDone,
    DecodeError,
    Demand,
    JobExited,
    JobStarted,
    JobSubmit,
    decode,
    encode,
    now,
)
from shared.mig.geometry import default_geometry
from shared.state import TERMINAL_STATES, audit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
GEO = default_geometry()
N_BAD = 240

BASES: dict[str, dict[str, Any]] = {
    "jobs.submit": {
        "v": 1,
        "id": "s-x",
        "job_id": "fz-x",
        "demand": {"kind": "mig", "profile": "1g.5gb"},
        "submitted_at": 1.7e9,
        "workload": {"argv": ["a"], "env": {"A": "1"}},
    },
    "jobs.cancel": {"v": 1, "id": "c-x", "job_id": "fz-x", "at": 1.7e9},
    "jobs.exit": {
        "v": 1,
        "id": "e-x",
        "job_id": "fz-x",
        "node": "n1",
        "gpu_id": "n1/0",
        "instance_id": "n1/0:1g.5gb@6:fz-x",
        "kind": "completed",
        "at": 1.7e9,
    },
    "node.n1.report": {"v": 1, "id": "r-x", "kind": "job_exit", "node": "n1", "at": 1.7e9, "job_id": "fz-x"},
    "node.n1.heartbeat": {"v": 1, "id": "h-x", "node": "n1", "seq": 1, "at": 1.7e9, "running": []},
    "cmd.n1": {"v": 1, "id": "k-x", "cmd_id": "k-x", "kind": "place", "node": "n1", "at": 1.7e9},
}
HOSTILE: list[Any] = [
    None,
    True,
    -1,
    2**64,
    -1e308,
    1e308,
    "",
    "💥" * 300,
    "x" * 70_000,
    "a.b.*",
    ">",
    [],
    {},
    [[[[[]]]]],
    {"kind": "teleport"},
    {"kind": "mig", "profile": "9g.99gb"},
    "\u0000",
    0.5,
    "NaN",
    "../x",
    "n2",
]


def malformed(rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    """``n`` messages that ``decode`` refuses, each on one of the subjects above."""
    out: list[tuple[str, bytes]] = []
    while len(out) < n:
        subject = rng.choice(sorted(BASES))
        doc = json.loads(json.dumps(BASES[subject]))
        how = rng.randrange(8)
        if how == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif how == 1:
            data = b'{"a":' * rng.randrange(40_000, 50_000)  # past the recursion limit, under the size bound
        elif how == 2:
            data = json.dumps(doc).encode()[: rng.randrange(1, 40)]  # truncated
        elif how == 3:
            doc.pop(rng.choice(sorted(doc)))
            doc[rng.choice(sorted(doc))] = rng.choice(HOSTILE)
            data = json.dumps(doc).encode()
        elif how == 4:
            doc["v"] = rng.choice([0, -3, 1001, "1", None])
            data = json.dumps(doc).encode()
        elif how == 5:
            key = rng.choice(sorted(doc))
            doc[key] = rng.choice(HOSTILE)
            data = json.dumps(doc, allow_nan=True).encode()
        elif how == 6:
            data = json.dumps(doc).encode().replace(b"1700000000.0", rng.choice([b"NaN", b"1e400", b"-1"]))
        else:
            data = json.dumps({**doc, "node": "n2"}).encode() if "node" in doc else b"null"
        try:
            decode(subject, data)
        except DecodeError:
            out.append((subject, data))
    return out



async def until(pred: Any, timeout: float = 20.0) -> bool:
    return await wait_for(pred, timeout)


async def dlq_messages(ns: Namespace) -> list[Any]:
    sub = await ns.bus.js.pull_subscribe(
        ns.bus.subjects.dlq(">"), durable=None, stream=ns.bus.subjects.stream_dlq
    )
    out: list[Any] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(500, timeout=0.5)
            except Exception:
                break
            if not msgs:
                break
            out += msgs
            for m in msgs:
                await m.ack()
    finally:
        await sub.unsubscribe()
    return out


def alive(stack: Stack) -> bool:
    return all(not t.done() for s in stack.services for t in s._tasks)


async def test_malformed_messages_are_dead_lettered_with_a_reason_and_the_stack_keeps_working(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with Namespace(make_settings(prefix, nats_url, redis_url)) as ns:
        stack = Stack(prefix, nats_url, redis_url)
        await stack.start()
        ex = ScriptedExecutor(ns.bus, "n1", gpus=4)
        try:
            await ex.start()
            assert await until(lambda: _true(len(stack.balancer.mirrors[0]) >= 4))
            real = [f"ok{n}" for n in range(24)]
            bad = malformed(random.Random(20261129), N_BAD)
            subj = ns.bus.subjects
            # real jobs first half, then the hostile stream, then the second half
            for j in real[:12]:
                await ns.bus.publish(subj.jobs_submit, _submit(j))
            for n, (subject, data) in enumerate(bad):
                await ns.bus.js.publish(f"{prefix}.{subject}", data, headers={"Nats-Msg-Id": f"bad-{n}"})
            # valid but nonsensical: an exit and a start of jobs never placed, a result nobody asked for
            r = subj.node_report("n1")
            await ns.bus.publish(
                r, JobExited(id="ghost-exit", node="n1", at=now(), job_id="ghost", exit="completed")
            )
            await ns.bus.publish(
                r,
                JobStarted(
                    id="ghost-start", node="n1", at=now(), job_id="ghost2", instance_id="n1/0:1g.5gb@6:ghost2"
                ),
            )
            await ns.bus.publish(
                r,
                CmdDone(
                    id="ghost-done",
                    node="n1",
                    at=now(),
                    cmd_id="place:nobody:0",
                    command="place",
                    job_id="nobody",
                ),
            )
            for j in real[12:]:
                await ns.bus.publish(subj.jobs_submit, _submit(j))

            async def all_dead() -> bool:
                return len(await dlq_messages(ns)) >= N_BAD

            assert await until(all_dead, 40), f"{len(await dlq_messages(ns))} of {N_BAD} dead-lettered"
            dead = await dlq_messages(ns)
            assert len(dead) == N_BAD  # each exactly once, although jobs.exit has three consumers
            ids = set()
            for m in dead:
                h = m.headers or {}
                assert h.get("Migsched-Error", "").strip(), h
                orig = h["Migsched-Original-Subject"]
                assert m.subject == subj.dlq(orig)
                ids.add(h["Migsched-Original-Msg-Id"])
            assert ids == {f"bad-{n}" for n in range(N_BAD)}
            reasons = " ".join((m.headers or {})["Migsched-Error"] for m in dead)
            for specific in ("malformed JSON", "invalid", "nested too deeply"):
                assert specific in reasons
            assert alive(stack), "a consumer or periodic task died"

            # every real job is placed and runs; then all end
            async def running() -> bool:
                return all(j in ex.running for j in real)

            assert await until(running, 30), sorted(set(real) - set(ex.running))
            await ex.exit(real)

            async def done() -> bool:
                recs = await ns.state.jobs(real)
                return all(x is not None and x.state in TERMINAL_STATES for x in recs)

            assert await until(done, 30)
            assert [v for v in await audit(ns.state, GEO)] == []
            for ghost in ("ghost", "ghost2", "nobody"):
                rec = await ns.state.job(ghost)
                assert rec is None or rec.state not in ("running", "placing"), rec
            # no job was created from the hostile stream
            known = set(await ns.state.all_job_ids(0))
            assert known <= set(real) | {"ghost", "ghost2", "nobody"}, sorted(known - set(real))
            assert alive(stack)
        finally:
            await ex.stop()
            await stack.stop()


def _submit(job: str) -> JobSubmit:
    return JobSubmit(
        id=f"s-{job}",
        job_id=job,
        demand=Demand(kind="mig", profile="1g.5gb"),
        submitted_at=now(),
        duration_hint_s=60.0,
    )


async def _true(v: bool) -> bool:
    return v


def test_the_generator_only_makes_messages_the_decoder_refuses() -> None:
    for subject, data in malformed(random.Random(1), 50):
        with pytest.raises(DecodeError):
            decode(subject, data)
    assert encode  # re-exported helpers in use
