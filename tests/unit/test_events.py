"""Wire schemas: round trips, bounds, semantic checks, subject names, JSON Schema."""

from __future__ import annotations

import contextlib
import json

import jsonschema
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import (
    CmdDone,
    Command,
    DecodeError,
    Demand,
    GpuReport,
    Heartbeat,
    JobCancel,
    JobExit,
    JobSubmit,
    Registered,
    Subjects,
    decode,
    encode,
    json_schemas,
)
from shared.policy.partition import MigOp

pytestmark = pytest.mark.unit


def submit(**kw: object) -> JobSubmit:
    base: dict[str, object] = {
        "id": "m-1",
        "job_id": "j1",
        "demand": Demand(kind="mig", profile="3g.20gb"),
        "submitted_at": 1.7e9,
    }
    base.update(kw)
    return JobSubmit(**base)  # type: ignore[arg-type]


def test_every_message_round_trips_through_its_subject() -> None:
    s = Subjects("")
    msgs = [
        (s.jobs_submit, submit()),
        (s.jobs_cancel, JobCancel(id="c", job_id="j1", at=1.0)),
        (
            s.jobs_exit,
            JobExit(
                id="e",
                job_id="j1",
                node="n1",
                gpu_id="n1/0",
                instance_id="n1/0:1g.5gb@6:j1",
                kind="completed",
                at=1.0,
            ),
        ),
        (
            s.cmd("n1"),
            Command(
                id="k",
                cmd_id="k",
                kind="place",
                node="n1",
                gpu_index=0,
                at=1.0,
                ops=(
                    MigOp(
                        kind="create_gi",
                        gpu_id="n1/0",
                        instance_id="i",
                        profile="1g.5gb",
                        profile_id=19,
                        start=6,
                        size=1,
                    ),
                ),
            ),
        ),
        (
            s.node_report("n1"),
            Registered(id="r", node="n1", at=1.0, gpus=(GpuReport(index=0, model="A100-40GB"),)),
        ),
        (s.node_report("n1"), CmdDone(id="d", node="n1", at=1.0, cmd_id="k", command="place", job_id="j1")),
        (s.node_heartbeat("n1"), Heartbeat(id="h", node="n1", seq=3, at=1.0, running=("j1",))),
    ]
    for subject, msg in msgs:
        assert decode(subject, encode(msg)) == msg


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        ({"job_id": ""}, "$.job_id"),
        ({"job_id": "x" * 129}, "$.job_id"),
        ({"job_id": "a.b>c"}, "$.job_id"),
        ({"priority": 1001}, "$.priority"),
        ({"tenant": "a b"}, "$.tenant"),
        ({"duration_hint_s": -1}, "$.duration_hint_s"),
        ({"labels": {"bad key!": "v"}}, "$.labels"),
        ({"workload": {"argv": ["x"], "env": {"1BAD": "v"}}}, "$.workload.env"),
        ({"workload": {"argv": ["x"], "surprise": 1}}, "unknown field"),
        ({"demand": {"kind": "mig", "profile": "1g.5gb", "gpus": 2}}, "invalid demand"),
        ({"demand": {"kind": "mig"}}, "invalid demand"),
        ({"demand": {"kind": "mig", "profile": "11g.500gb"}}, "unknown profile"),
        ({"demand": {"kind": "mig", "compute_slices": 8, "memory_gb": 500}}, "unknown profile"),
        ({"demand": {"kind": "tpu"}}, "$.demand.kind"),
    ],
)
def test_an_invalid_submit_is_refused_with_a_specific_reason(patch: dict, reason: str) -> None:  # type: ignore[type-arg]
    raw = msgspec.json.decode(encode(submit()))
    raw.update(patch)
    with pytest.raises(DecodeError) as err:
        decode("jobs.submit", json.dumps(raw).encode())
    assert reason in err.value.reason


def test_a_demand_checked_once_is_judged_again_under_another_geometry() -> None:
    from shared.events.codec import check_demand
    from shared.mig.geometry import Geometry, default_geometry

    d = Demand(kind="mig", profile="1g.5gb")
    check_demand(d)
    check_demand(d)  # the second time from the cache
    only_h100 = Geometry(m for m in default_geometry().models if all(p.name != "1g.5gb" for p in m.profiles))
    with pytest.raises(DecodeError, match="unknown profile"):
        check_demand(d, only_h100)
    check_demand(d, default_geometry())
    with pytest.raises(DecodeError, match="invalid demand"):  # an incoherent one is never taken as checked
        check_demand(Demand(kind="mig"))
    with pytest.raises(DecodeError, match="invalid demand"):
        check_demand(Demand(kind="mig"))


def test_a_profile_known_to_some_model_and_a_shape_and_a_size_are_accepted() -> None:
    for d in (
        Demand(kind="mig", profile="1g.18gb"),
        Demand(kind="mig", profile="3g"),
        Demand(kind="mig", profile="nvidia.com/mig-2g.10gb"),
        Demand(kind="mig", compute_slices=2, memory_gb=10),
        Demand(kind="gpus", gpus=4),
        Demand(kind="shared"),
    ):
        assert decode("jobs.submit", encode(submit(demand=d))).demand == d


def test_a_node_cannot_report_for_another_node() -> None:
    hb = Heartbeat(id="h", node="n1", seq=1, at=1.0)
    with pytest.raises(DecodeError, match="n1"):
        decode("node.n2.heartbeat", encode(hb))


def test_unknown_subjects_and_huge_messages_are_refused() -> None:
    with pytest.raises(DecodeError, match="unknown subject"):
        decode("jobs.frobnicate", b"{}")
    with pytest.raises(DecodeError, match="exceeds"):
        decode("jobs.submit", b" " * (300 * 1024))


def test_a_namespace_prefixes_subjects_and_streams_and_decoding_follows_it() -> None:
    s = Subjects("t1")
    assert s.jobs_submit == "t1.jobs.submit" and s.cmd("n1") == "t1.cmd.n1" and s.stream_cmd == "t1_CMD"
    assert s.dlq("t1.jobs.submit") == "t1.dlq.jobs.submit" and Subjects("").dlq("cmd.n1") == "dlq.cmd.n1"
    assert decode("t1.jobs.submit", encode(submit()), s).job_id == "j1"
    with pytest.raises(DecodeError):
        decode("jobs.submit", encode(submit()), s)
    with pytest.raises(ValueError):
        Subjects("a.b")


def test_unknown_fields_are_ignored_so_schemas_can_grow() -> None:
    raw = msgspec.json.decode(encode(submit()))
    raw["added_in_v2"] = {"anything": 1}
    assert decode("jobs.submit", json.dumps(raw).encode()).job_id == "j1"


def test_the_json_schemas_validate_what_the_decoder_accepts() -> None:
    schemas = json_schemas()
    assert {"JobSubmit", "JobCancel", "JobExit", "Command", "NodeReport", "Heartbeat"} <= set(schemas)
    good = msgspec.json.decode(encode(submit()))
    jsonschema.validate(good, schemas["JobSubmit"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, "priority": 5000}, schemas["JobSubmit"])
    report = msgspec.json.decode(encode(CmdDone(id="d", node="n1", at=1.0, cmd_id="k", command="place")))
    jsonschema.validate(report, schemas["NodeReport"])


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.dictionaries(st.text(max_size=10), st.text(max_size=10)).map(lambda d: json.dumps(d).encode()),
    )
)
def test_arbitrary_bytes_either_decode_or_raise_decode_error(data: bytes) -> None:
    for subject in ("jobs.submit", "jobs.exit", "node.n1.report", "cmd.n1"):
        with contextlib.suppress(DecodeError):
            decode(subject, data)
