"""``migsched check``'s cross-check of the state against what the executors report in their heartbeats: only
settled disagreements are reported, each with what the node runs and what the state says."""

from __future__ import annotations

import pytest

from migsched.commands import check

pytestmark = pytest.mark.unit


def test_the_executor_cross_check_reports_only_settled_disagreements() -> None:
    t = 1000.0
    jobs = {
        "ok": ("running", "n1", t - 10),  # running on n1 and n1 lists it
        "vanished": ("running", "n1", t - 10),  # the state says running on n1; n1 does not list it
        "fresh": ("running", "n1", t + 0.5),  # just placed: too recent to judge
        "ghost": ("finished", "n1", t - 10),  # finished per the state, but n1 still runs it
        "elsewhere": ("running", "n2", t - 10),  # n1 runs it; the state has it on n2
        "lostjob": ("running", "n3", t - 10),  # n3 is lost: not expected to report
    }
    beats = {
        "n1": [(t, {"ok", "ghost", "elsewhere"}), (t + 1, {"ok", "ghost", "elsewhere"})],
        "n2": [(t, {"elsewhere"})],
        "n3": [(t, set())],
    }
    found = {(v.subject, v.kind) for v in check.executor_checks(jobs, beats, lost_nodes={"n3"})}
    assert found == {("vanished", "executor"), ("ghost", "executor"), ("elsewhere", "executor")}
    msgs = {v.subject: v.detail for v in check.executor_checks(jobs, beats, lost_nodes={"n3"})}
    assert msgs["ghost"] == "n1 runs it, but the state has it finished"
    assert msgs["elsewhere"] == "n1 runs it, but the state has it running on n2"


def test_the_executor_cross_check_reports_a_job_run_on_another_instance_than_the_states() -> None:
    t = 1000.0
    jobs = {j: ("running", "n1", t - 10) for j in ("same", "moved", "gang")} | {"new": ("running", "n1", t + 0.5)}
    beats = {"n1": [(t, {"same", "moved", "gang", "new"})]}
    slots = {"n1": {"same": "0:1g.5gb@6", "moved": "1:1g.5gb@6", "gang": "3:7g.40gb@0", "new": "2:3g.20gb@4"}}
    insts = {"same": "n1/0:1g.5gb@6:same", "moved": "n1/0:1g.5gb@6:moved", "new": "n1/2:3g.20gb@0:new"}
    found = check.executor_checks(jobs, beats, lost_nodes=set(), slots=slots, insts=insts)
    # a gang's parts are not compared (no single instance); a job placed within the window may be on its way
    assert [(v.subject, v.detail) for v in found] == [
        ("moved", "n1 runs it on GPU 1 1g.5gb@6, but the state has it on n1/0:1g.5gb@6:moved")]


def test_a_gang_across_nodes_is_expected_in_the_heartbeat_of_each_of_its_nodes() -> None:
    t = 1000.0
    jobs = {"gang": ("running", "n1", t - 10), "half": ("running", "n1", t - 10)}  # the state names the first node
    gangs = {"gang": frozenset({"n1", "n2"}), "half": frozenset({"n1", "n2"})}
    beats = {"n1": [(t, {"gang", "half"})], "n2": [(t, {"gang"})], "n3": [(t, {"gang"})]}
    found = {v.subject: v.detail for v in check.executor_checks(jobs, beats, lost_nodes=set(), gangs=gangs)}
    assert found == {"gang": "n3 runs it, but the state has it running on n1, n2",
                     "half": "running on n2 per the state, but n2's heartbeat does not list it"}
