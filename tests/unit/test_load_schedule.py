"""The generator's schedules are exact and open-loop: a slow system never slows the offered load."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from load.generator import Generator, JobFactory, LoadError, from_trace, phased, read_trace, steady
from shared.events import JobSubmit, Subjects

pytestmark = pytest.mark.unit


def test_a_steady_schedule_places_instant_i_at_exactly_i_over_rate() -> None:
    offsets = list(steady(1000, 2.0))
    assert len(offsets) == 2000
    assert offsets[0] == 0.0 and offsets[1] == 0.001 and offsets[1999] == 1.999  # no accumulated drift


def test_phases_follow_each_other_and_a_zero_rate_is_a_pause() -> None:
    offsets = list(phased([(2, 1.0), (0, 3.0), (4, 0.5)]))
    assert offsets == [0.0, 0.5, 4.0, 4.25]


def test_a_trace_replays_from_its_first_arrival_at_the_speedup() -> None:
    assert list(from_trace([100.0, 110.0, 130.0], speedup=10)) == [0.0, 1.0, 3.0]
    with pytest.raises(LoadError):
        list(from_trace([5.0, 4.0]))


def test_bad_rates_are_refused() -> None:
    with pytest.raises(LoadError):
        steady(0, 10)


def test_traces_read_from_json_lines_and_csv(tmp_path: Path) -> None:
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"t": 0.5, "profile": "2g.10gb", "duration_s": 3}\n\n{"t": 1}\n')
    csvf = tmp_path / "t.csv"
    csvf.write_text("t,profile,duration_s\n0.5,2g.10gb,3\n1,,\n")
    for path in (jl, csvf):
        jobs = read_trace(path)
        got = [(j.t, j.profile, j.duration_s) for j in jobs]
        assert got == [(0.5, "2g.10gb", 3.0), (1.0, "1g.5gb", None)]
    (tmp_path / "bad.jsonl").write_text('{"t": "soon"}\n')
    with pytest.raises(LoadError):
        read_trace(tmp_path / "bad.jsonl")


def test_generated_jobs_are_valid_job_submits_with_the_mix_and_a_stable_seed() -> None:
    a = JobFactory("r1", {"1g.5gb": 3, "3g.20gb": 1}, duration_hint_s=0.5)
    b = JobFactory("r1", {"1g.5gb": 3, "3g.20gb": 1}, duration_hint_s=0.5)
    jobs = [a.make(i) for i in range(400)]
    assert [j.demand.profile for j in jobs] == [b.make(i).demand.profile for i in range(400)]
    share = sum(j.demand.profile == "1g.5gb" for j in jobs) / len(jobs)
    assert 0.65 < share < 0.85
    wire = msgspec.json.encode(jobs[7])
    back = msgspec.json.decode(wire, type=JobSubmit)
    assert (back.job_id, back.id, back.duration_hint_s) == ("r1-7", "m-r1-7", 0.5)


class FakeClock:
    """Nanosecond clock that only moves when the generator sleeps or a publish 'costs' time."""

    def __init__(self) -> None:
        self.now = 0
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += int(seconds * 1e9)


class FakeNats:
    def __init__(self, clock: FakeClock, cost_ns: int) -> None:
        self.clock, self.cost_ns = clock, cost_ns
        self.sent: list[tuple[int, str, bytes, str, dict[str, str]]] = []
        self.ack_cb: Any = None

    def new_inbox(self) -> str:
        return "_INBOX.publisher.x"

    async def subscribe(self, subject: str, cb: Any, **kw: Any) -> None:
        self.ack_cb = cb

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None:
        self.sent.append((self.clock.now, subject, payload, reply, headers or {}))
        self.clock.now += self.cost_ns  # a slow system (or a slow client) costs time per message

    async def flush(self, timeout: int = 10) -> None:
        return None


async def run(cost_ns: int, rate: float = 1000, seconds: float = 0.1) -> tuple[FakeClock, FakeNats, Generator,
                                                                                list[tuple[str, int]]]:
    clock = FakeClock()
    nc = FakeNats(clock, cost_ns)
    submitted: list[tuple[str, int]] = []
    gen = Generator(nc, Subjects("ns"), JobFactory("r"), steady(rate, seconds), clock=clock,
                    sleep=clock.sleep,
                    on_submit=lambda job, t: submitted.append((job, t)))
    await gen.run()
    return clock, nc, gen, submitted


async def test_on_time_sends_wait_for_each_instant_and_carry_it_as_the_submit_time() -> None:
    _, nc, gen, submitted = await run(cost_ns=10_000)  # 10 µs per publish: keeps up easily
    assert len(nc.sent) == 100
    assert [t for t, *_ in nc.sent] == [i * 1_000_000 for i in range(100)]
    assert submitted == [(f"r-{i}", i * 1_000_000) for i in range(100)]
    assert gen.stats.send_lag_us.get_max_value() <= 1


async def test_a_slow_system_does_not_slow_the_offered_load_down() -> None:
    clock, nc, gen, submitted = await run(cost_ns=3_000_000)  # each publish takes 3 ms: 3× too slow
    assert len(nc.sent) == 100
    assert clock.sleeps == []  # behind from the second message on: never waits, sends the backlog
    # the intended instants (and so the latency origins) stay on the 1 ms grid, not on the 3 ms one
    assert [t for _, t in submitted] == [i * 1_000_000 for i in range(100)]
    assert gen.stats.send_lag_us.get_max_value() >= 190_000  # the lag is reported, not hidden


async def test_every_publish_asks_for_a_jetstream_ack_with_a_dedupe_id() -> None:
    _, nc, _, _ = await run(cost_ns=0, seconds=0.005)
    for i, (_, subject, payload, reply, headers) in enumerate(nc.sent):
        assert subject == "ns.jobs.submit"
        assert reply == f"_INBOX.publisher.x.{i}"
        assert headers == {"Nats-Msg-Id": json.loads(payload)["id"]}


async def test_acks_errors_and_missing_acks_are_counted_apart() -> None:
    _, nc, gen, _ = await run(cost_ns=0, seconds=0.005)  # 5 messages
    replies = [
        (0, b'{"stream":"ns_JOBS","seq":1}', None),
        (1, b'{"stream":"ns_JOBS","seq":1,"duplicate":true}', None),
        (2, b'{"error":{"code":503,"description":"insufficient resources"}}', None),
        (3, b"", {"Status": "503"}),
    ]
    for i, data, headers in replies:
        await nc.ack_cb(SimpleNamespace(subject=f"_INBOX.publisher.x.{i}", data=data, headers=headers))
    await nc.ack_cb(SimpleNamespace(subject="_INBOX.publisher.x.0", data=b"{}", headers=None))  # a repeat
    s = gen.stats
    assert (s.acked, s.duplicates, s.unacked) == (2, 1, 1)
    assert dict(s.ack_errors) == {"insufficient resources": 1,
                                  "no stream captures the subject (no responders)": 1}
    assert await gen.wait_acks(0.01) == 1

