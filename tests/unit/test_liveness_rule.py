"""The registry's rule for calling a silent node lost (services/registry/liveness.py), on explicit clocks."""

from __future__ import annotations

from services.registry.liveness import LivenessWatch, overdue
from shared.bus import BusHealth

T = 4.0


def health(connected: bool, since: float) -> BusHealth:
    h = BusHealth(connected=connected)
    h.since = since
    return h


def test_a_node_silent_past_the_timeout_is_lost_when_the_registry_hears_others() -> None:
    w = LivenessWatch(T, now=96.0)
    w.heard(99.0)
    start = w.silence_from(health(True, 0.0), 100.0)
    assert start == 96.0
    assert overdue(last_seen=90.0, now=101.0, timeout=T, heard_from=start)
    assert not overdue(last_seen=98.0, now=101.0, timeout=T, heard_from=start)
    assert not overdue(last_seen=90.0, now=99.0, timeout=T, heard_from=start)  # the start is a grace too


def test_nobody_is_judged_while_the_bus_is_down() -> None:
    w = LivenessWatch(T, now=0.0)
    w.heard(99.0)
    assert w.silence_from(health(False, 95.0), 100.0) is None
    assert not overdue(last_seen=0.0, now=100.0, timeout=T, heard_from=None)


def test_after_a_reconnect_every_node_gets_a_fresh_timeout() -> None:
    w = LivenessWatch(T, now=96.0)
    w.heard(99.0)
    start = w.silence_from(health(True, 98.0), 100.0)
    assert start == 98.0
    assert not overdue(last_seen=50.0, now=100.0, timeout=T, heard_from=start)
    assert overdue(last_seen=50.0, now=102.5, timeout=T, heard_from=start)


def test_a_silence_from_everyone_holds_judgement_for_one_more_timeout_then_lets_it_go() -> None:
    w = LivenessWatch(T, now=8.0)
    w.heard(10.0)
    h = health(True, 0.0)
    assert w.silence_from(h, 13.0) == 8.0  # a short quiet: judge as usual
    assert w.silence_from(h, 15.0) is None  # quiet for more than T: our side is suspect
    assert w.silence_from(h, 18.5) == 8.0  # quiet for 2 T: every node may really be gone


def test_the_first_heartbeat_after_a_long_silence_starts_a_fresh_timeout() -> None:
    w = LivenessWatch(T, now=8.0)
    w.heard(10.0)
    w.heard(16.0)  # 6 s of silence from everyone, then a heartbeat
    assert w.back_at == 16.0
    w.heard(16.5)  # ordinary heartbeats do not move it
    assert w.back_at == 16.0
    assert w.silence_from(health(True, 0.0), 17.0) == 16.0


def test_a_command_sent_before_an_outage_waits_a_full_timeout_from_the_reconnect() -> None:
    # the same rule times out commands (``sweep_commands``): sent at 10, the bus back at 98 (wall = monotonic)
    w = LivenessWatch(T, now=96.0)
    w.heard(99.0)
    assert w.silence_from(health(False, 97.0), 99.5) is None  # down: no command is late
    start = w.silence_from(health(True, 98.0), 100.0)
    assert not overdue(last_seen=10.0, now=100.0, timeout=T, heard_from=start)
    assert overdue(last_seen=10.0, now=102.5, timeout=T, heard_from=start)
