"""The generator's schedules are exact and open-loop: a slow system never slows the offered load."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from load.generator import Generator, JobFactory, LoadError, from_trace, paced, phased, read_trace, steady
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


class Clock:
    """Nanoseconds that move only when the pacer sleeps or the test says a publish cost time (time handed in)."""

    def __init__(self) -> None:
        self.now = 0
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += int(seconds * 1e9)


async def send(cost_ns: int, rate: float = 1000, seconds: float = 0.1) -> tuple[Clock, list[tuple[int, int, int]]]:
    """Pace ``steady(rate, seconds)`` where each send costs ``cost_ns``: (sent at, due, now) per message."""
    clock = Clock()
    sent: list[tuple[int, int, int]] = []
    async for _, due, now in paced(steady(rate, seconds), clock(), clock, clock.sleep):
        sent.append((clock(), due, now))
        clock.now += cost_ns  # a slow system (or a slow client) costs time per message
    return clock, sent


async def test_on_time_sends_wait_for_each_instant() -> None:
    _, sent = await send(cost_ns=10_000)  # 10 µs per publish: keeps up easily
    assert len(sent) == 100
    assert [t for t, _, _ in sent] == [i * 1_000_000 for i in range(100)]
    assert all(now == due for _, due, now in sent)  # no lag


async def test_a_slow_system_does_not_slow_the_offered_load_down() -> None:
    clock, sent = await send(cost_ns=3_000_000)  # each publish takes 3 ms: 3× too slow
    assert len(sent) == 100
    assert clock.sleeps == []  # behind from the second message on: never waits, sends the backlog
    # the intended instants (and so the latency origins) stay on the 1 ms grid, not on the 3 ms one
    assert [due for _, due, _ in sent] == [i * 1_000_000 for i in range(100)]
    assert max(now - due for _, due, now in sent) >= 190_000_000  # the lag is there to report, not hidden


async def test_acks_errors_and_missing_acks_are_counted_apart() -> None:
    gen = Generator(None, Subjects("ns"), JobFactory("r"), [])  # type: ignore[arg-type]  # only reads acks here
    gen._inbox = "_INBOX.publisher.x"
    gen._intended = {i: 0 for i in range(5)}
    gen.stats.sent = 5
    replies = [
        (0, b'{"stream":"ns_JOBS","seq":1}', None),
        (1, b'{"stream":"ns_JOBS", "seq":1,"duplicate": true}', None),  # as nats-server writes it
        (2, b'{"error":{"code":503,"description":"insufficient resources"}}', None),
        (3, b"", {"Status": "503"}),
    ]
    for i, data, headers in replies:
        await gen._on_ack(SimpleNamespace(subject=f"_INBOX.publisher.x.{i}", data=data, headers=headers))
    await gen._on_ack(SimpleNamespace(subject="_INBOX.publisher.x.0", data=b"{}", headers=None))  # a repeat
    s = gen.stats
    assert (s.acked, s.duplicates, s.unacked) == (2, 1, 1)
    assert dict(s.ack_errors) == {"insufficient resources": 1,
                                  "no stream captures the subject (no responders)": 1}
    assert await gen.wait_acks(0.01) == 1
