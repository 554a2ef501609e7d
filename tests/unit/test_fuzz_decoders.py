"""Fuzzing ``shared.events.decode`` on every subject with malformed and adversarial messages.

Whatever arrives, ``decode`` either returns a valid message (one that encodes and decodes again to itself,
so nothing unbounded such as an infinity slips through) or raises ``DecodeError`` with a non-empty reason;
never another exception. Inputs: random bytes, random JSON documents, deep nesting, and mutations of a valid
message of each subject (a field removed, a field replaced with a hostile value, an unknown field added, a
wrong schema version)."""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.events import (
    MAX_MESSAGE_BYTES,
    CapacityChanged,
    CmdDone,
    CmdFailed,
    Command,
    DecodeError,
    Demand,
    Drift,
    GpuReport,
    Heartbeat,
    InstanceReport,
    JobCancel,
    JobExit,
    JobExited,
    JobInfo,
    JobStarted,
    JobSubmit,
    MigrateOrder,
    MoveSpec,
    Placed,
    Registered,
    Subjects,
    Workload,
    decode,
    encode,
    wire_gpu,
)
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.policy.placement.balancer import BalancerParams, place
from shared.policy.placement.decision import JobRequest, Placement
from shared.policy.snapshot import SnapshotBuilder
from shared.state.model import StoredGpu

pytestmark = pytest.mark.unit

SUBJECTS = Subjects("")
NS = Subjects("fz")


def _placement() -> tuple[Placement, Any]:
    geo = default_geometry()
    g = StoredGpu(id="n1/0", node="n1", index=0, model="A100-40GB").view()
    b = SnapshotBuilder(geo)
    b.put(g)
    dec = place(b.snapshot(), JobRequest(job_id="j1", demand=Demand(profile="1g.5gb")), BalancerParams())
    assert isinstance(dec, Placement)
    return dec, wire_gpu(g)


def valid_messages() -> dict[str, msgspec.Struct]:
    """One valid message per subject (the starting points of the mutations)."""
    placement, gpu = _placement()
    op = MigOp(
        kind="create_gi",
        gpu_id="n1/0",
        instance_id="n1/0:1g.5gb@6:j1",
        profile="1g.5gb",
        profile_id=19,
        start=6,
        size=1,
    )
    inst = InstanceReport(instance_id="n1/0:1g.5gb@6:j1", gi_id=1, ci_id=0, profile="1g.5gb", start=6, size=1)
    return {
        "jobs.submit": JobSubmit(
            id="s-1",
            job_id="j1",
            demand=Demand(profile="3g.20gb"),
            submitted_at=1.7e9,
            workload=Workload(argv=("python", "x.py"), env={"A": "1"}),
            labels={"k": "v"},
            patience_s=10.0,
            duration_hint_s=5.0,
            priority=3,
            tenant="team-a",
        ),
        "jobs.cancel": JobCancel(id="c-1", job_id="j1", at=1.7e9, reason="x"),
        "jobs.exit": JobExit(
            id="e-1",
            job_id="j1",
            node="n1",
            gpu_id="n1/0",
            instance_id="n1/0:1g.5gb@6:j1",
            kind="completed",
            at=1.7e9,
        ),
        "sched.placed": Placed(
            id="p-1",
            job_id="j1",
            placement=placement,
            gpu=gpu,
            gpu_version=1,
            job=JobInfo(),
            decided_at=1.7e9,
        ),
        "sched.migrate": MigrateOrder(
            id="mg-1",
            move=MoveSpec(
                job_id="j1",
                kind="intra",
                src_gpu="n1/0",
                src_instance="n1/0:1g.5gb@6:j1",
                src_profile="1g.5gb",
                src_start=6,
                dst_gpu="n1/0",
                dst_profile="1g.5gb",
                dst_start=5,
                dst_size=1,
            ),
            src_node="n1",
            dst_node="n1",
            dst_instance="n1/0:1g.5gb@5:j1.x",
            nonce="x",
            dst_gpu_view=gpu,
            job=JobInfo(),
            decided_at=1.7e9,
        ),
        "sched.capacity": CapacityChanged(id="k-1", gpu_ids=("n1/0",), at=1.7e9),
        "cmd.n1": Command(
            id="place:j1:0",
            cmd_id="place:j1:0",
            kind="place",
            node="n1",
            gpu_index=0,
            ops=(op,),
            instance_id="n1/0:1g.5gb@6:j1",
            job_id="j1",
            at=1.7e9,
        ),
        "node.n1.report": Registered(
            id="r-1", node="n1", at=1.7e9, gpus=(GpuReport(index=0, model="A100-40GB", instances=(inst,)),)
        ),
        "node.n1.heartbeat": Heartbeat(id="h-1", node="n1", seq=3, at=1.7e9, running=("j1",)),
    }


VALID = valid_messages()
REPORTS = [
    CmdDone(id="d", node="n1", at=1.0, cmd_id="place:j1:0", command="place", job_id="j1", instance=None),
    CmdFailed(id="f", node="n1", at=1.0, cmd_id="place:j1:0", command="place", error="boom", code=3),
    JobStarted(id="st", node="n1", at=1.0, job_id="j1", instance_id="n1/0:1g.5gb@6:j1"),
    JobExited(id="x", node="n1", at=1.0, job_id="j1", exit="failed", status=-9),
    Drift(id="dr", node="n1", at=1.0, details=("x",)),
]
SUBJECT_LIST = sorted(VALID)


def check(subject: str, data: bytes, subjects: Subjects = SUBJECTS) -> None:
    """The property: a valid, re-encodable message or a DecodeError with a reason; nothing else."""
    try:
        msg = decode(subject, data, subjects)
    except DecodeError as exc:
        assert exc.reason and exc.reason.strip(), f"empty reason for {data[:80]!r}"
        assert len(exc.reason) < 10_000
        return
    again = decode(subject, encode(msg), subjects)  # nothing lost or made unreadable on the way
    assert again == msg


def test_every_valid_example_decodes_to_itself() -> None:
    for subject, msg in VALID.items():
        assert decode(subject, encode(msg)) == msg
    for r in REPORTS:
        assert decode("node.n1.report", encode(r)) == r


# --- hostile values -----------------------------------------------------------------------------------------
HUGE = "x" * 300_000
hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 7, 8, 255, 1000, 1001, -1000, -1001, 10**11, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 1e308, -1e308, 5e-324, 1e11, 1e11 + 1, 1e8 + 0.5]),
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "..",
            "a.b",
            "*",
            ">",
            "node.x",
            "\x00",
            "\u202e",
            "💥" * 10,
            "A" * 5000,
            "1g.5gb",
            "9g.99gb",
            "7g.80gb",
            "3g",
            "mig",
            "gpus",
            "shared",
            "completed",
            "bogus",
            "place",
            "cmd_done",
            "registered",
            "../../etc/passwd",
            "a" * 129,
            "-x",
            "x\n",
        ]
    ),
)
json_values = st.recursive(
    hostile_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=25,
)
RAW_TOKENS = [
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"00",
    b"1.",
    b"+1",
    b"0x10",
    b'"\\ud800"',
    b'"\\u0000"',
    b"true",
    b"null",
    b"[]",
    b"{}",
    b'"' + HUGE.encode() + b'"',
]


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for n, v in enumerate(obj):
            out.append((*prefix, n))
            out += _paths(v, (*prefix, n))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid message of a random subject with 1-4 hostile edits."""
    subject = draw(st.sampled_from(SUBJECT_LIST))
    base = VALID[subject]
    if subject == "node.n1.report":
        base = draw(st.sampled_from([base, *REPORTS]))
    doc = json.loads(encode(base))
    raw_token: bytes | None = None
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        op = draw(st.sampled_from(["replace", "delete", "extra", "version", "raw", "nest", "dup"]))
        if op == "version":
            doc["v"] = draw(st.sampled_from([0, 2, 999, 1001, -1, "1", 1.5, None, 10**30]))
        elif op == "extra":
            doc[draw(st.text(min_size=1, max_size=20))] = draw(json_values)
        elif op == "nest" and paths:
            path = draw(st.sampled_from(paths))
            depth = draw(st.integers(1, 200))
            value: Any = _parent(doc, path)[path[-1]]
            for _ in range(depth):
                value = [value]
            _parent(doc, path)[path[-1]] = value
        elif op == "raw" and paths:
            path = draw(st.sampled_from(paths))
            _parent(doc, path)[path[-1]] = "@@RAW@@"
            raw_token = draw(st.sampled_from(RAW_TOKENS))
        elif op == "delete" and paths:
            path = draw(st.sampled_from(paths))
            parent = _parent(doc, path)
            del parent[path[-1]]
        elif op == "dup" and isinstance(doc, dict):
            doc = {**doc, "id": draw(st.sampled_from(["", "x" * 201, "a b", "ok-1"]))}
        elif paths:
            path = draw(st.sampled_from(paths))
            _parent(doc, path)[path[-1]] = draw(json_values)
    data = dumps(doc)
    if raw_token is not None:
        data = data.replace(b'"@@RAW@@"', raw_token, 1)
    return subject, data


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_valid_messages_decode_or_fail_with_a_reason(case: tuple[str, bytes]) -> None:
    check(*case)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(SUBJECT_LIST), json_values)
def test_arbitrary_json_documents_decode_or_fail_with_a_reason(subject: str, value: Any) -> None:
    check(subject, dumps(value))


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(SUBJECT_LIST), st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_fail_with_a_reason(subject: str, data: bytes) -> None:
    check(subject, data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SUBJECT_LIST), st.integers(1, 100_000), st.sampled_from([b"[", b'{"a":', b'{"v":[']))
def test_deep_nesting_is_a_decode_error_not_a_crash(subject: str, depth: int, opener: bytes) -> None:
    check(subject, opener * depth)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SUBJECT_LIST), st.text(max_size=40))
def test_messages_on_the_wrong_subject_or_namespace_are_refused(subject: str, junk: str) -> None:
    data = encode(VALID[subject])
    check(f"{subject}.{junk}" if junk else subject, data)
    with pytest.raises(DecodeError):
        decode(subject, data, NS)  # outside the namespace
    other = "cmd.n2" if subject != "cmd.n2" else "cmd.n1"
    if subject.startswith(("cmd.", "node.")):
        with pytest.raises(DecodeError, match="node"):
            decode(subject.replace("n1", "n2"), data)
    del other


def test_a_message_over_the_size_bound_is_refused_before_parsing() -> None:
    for subject in SUBJECT_LIST:
        with pytest.raises(DecodeError, match="exceeds"):
            decode(subject, b" " * (MAX_MESSAGE_BYTES + 1))


@pytest.mark.parametrize(
    "demand, why",
    [
        ({"kind": "mig", "profile": "9g.99gb"}, "unknown profile"),
        ({"kind": "mig"}, "invalid demand"),
        ({"kind": "mig", "profile": "1g.5gb", "compute_slices": 1}, "invalid demand"),
        ({"kind": "mig", "compute_slices": 9}, "invalid"),
        ({"kind": "mig", "memory_gb": -1}, "invalid"),
        ({"kind": "gpus", "gpus": 0}, "invalid"),
        ({"kind": "teleport"}, "invalid"),
    ],
)
def test_a_submit_with_a_bad_demand_is_refused_with_a_specific_reason(demand: dict, why: str) -> None:  # type: ignore[type-arg]
    doc = json.loads(encode(VALID["jobs.submit"]))
    doc["demand"] = demand
    with pytest.raises(DecodeError) as info:
        decode("jobs.submit", dumps(doc))
    assert why in info.value.reason


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-5"])
def test_non_finite_and_negative_times_are_refused(token: bytes) -> None:
    data = encode(VALID["jobs.cancel"]).replace(b'"at":1700000000.0', b'"at":' + token)
    assert b'"at":' + token in data
    with pytest.raises(DecodeError):
        decode("jobs.cancel", data)


def test_finite_floats_survive_and_no_decoded_float_is_infinite() -> None:
    msg = decode("sched.placed", encode(VALID["sched.placed"]))
    assert math.isfinite(msg.placement.frag_after)
