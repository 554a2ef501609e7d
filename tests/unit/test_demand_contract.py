"""The published schema is the exact contract of a submit: what it accepts the decoder accepts (the job is then
placed, queued or rejected for capacity, never dead-lettered as invalid), and what the decoder refuses the schema
refuses. The rules JSON Schema cannot state are listed in every schema's description and tested here too."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.events import MAX_MESSAGE_BYTES, DecodeError, decode, json_schemas
from shared.events.codec import UNSTATED_RULES
from shared.events.demand_schema import servable_profiles, size_limits
from shared.mig.geometry import default_geometry
from tests.schema_strategy import instances

pytestmark = pytest.mark.unit
SCHEMAS = json_schemas()
SUBMIT = SCHEMAS["JobSubmit"]
VALIDATOR = jsonschema.Draft202012Validator(SUBMIT)
DEMAND = SUBMIT["$defs"]["Demand"]
GEOMETRY = default_geometry()


def submit_with(demand: Any) -> dict[str, Any]:
    return {"v": 1, "id": "m1", "job_id": "j1", "demand": demand, "submitted_at": 1.0}


def decodes(doc: dict[str, Any]) -> bool:
    try:
        decode("jobs.submit", json.dumps(doc).encode())
    except DecodeError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(SUBMIT))
def test_every_submit_the_published_schema_accepts_is_decoded(doc: dict[str, Any]) -> None:
    data = json.dumps(doc).encode()
    if len(data) > MAX_MESSAGE_BYTES:  # a rule the schema cannot state (listed in its description)
        return
    decode("jobs.submit", data)


@settings(max_examples=300, deadline=None)
@given(instances(DEMAND))
def test_every_demand_the_published_schema_accepts_is_decoded(demand: dict[str, Any]) -> None:
    assert decodes(submit_with(demand)), demand


_NEAR_PROFILES = [*servable_profiles(GEOMETRY)[:8], "8g", "3g.21gb", "nvidia.com/mig-", "", "mig-3g.20gb",
                  "nvidia.com/mig-7g.80gb", "1g.5gb", "7g+me", 5]
_NEAR_SIZES = sorted({x for c, gb in size_limits(GEOMETRY) for x in (gb, math.nextafter(gb, math.inf))})


def _field(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field left out (None here), set to null, or given one of ``values``."""
    return st.one_of(st.just(None), st.just("null"), values)


_DEMANDS = st.fixed_dictionaries({}, optional={
    "kind": st.sampled_from(["mig", "gpus", "shared", "whole", None, 1]),
    "profile": _field(st.sampled_from(_NEAR_PROFILES)),
    "compute_slices": _field(st.sampled_from([-1, 0, 1, 2, 3, 4, 7, 8, 9, 2.5, "3"])),
    "memory_gb": _field(st.one_of(st.sampled_from([0, -1.0, 4096, 4097, 1e-9, 20, "20"]),
                                  st.sampled_from(_NEAR_SIZES))),
    "gpus": _field(st.sampled_from([0, 1, 2, 8, 9, 4096, 4097, True, 1.5])),
    "extra": st.just({"ignored": True}),
})


def _wire(demand: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if v == "null" else v) for k, v in demand.items() if v is not None or k == "kind"}


@settings(max_examples=2000, deadline=None)
@given(_DEMANDS)
def test_a_demand_is_decoded_exactly_when_the_published_schema_accepts_it(raw: dict[str, Any]) -> None:
    doc = submit_with(_wire(raw))
    assert decodes(doc) == VALIDATOR.is_valid(doc), (doc, [e.message for e in VALIDATOR.iter_errors(doc)])


@pytest.mark.parametrize("demand", [
    {"profile": "3g.20gb"},  # today's kind-less MIG demand
    {"kind": "mig", "profile": "nvidia.com/mig-1g.5gb"},
    {"kind": "mig", "compute_slices": 3, "memory_gb": 20},
    {"kind": "gpus", "gpus": 16},
    {"kind": "shared"},
])
def test_the_demands_publishers_send_today_stay_valid(demand: dict[str, Any]) -> None:
    assert decodes(submit_with(demand)) and VALIDATOR.is_valid(submit_with(demand))


@pytest.mark.parametrize(("demand", "why"), [
    ({"kind": "mig"}, "neither a profile nor a size"),
    ({"profile": "3g.20gb", "compute_slices": 3, "memory_gb": 20}, "a profile and a size"),
    ({"compute_slices": 3}, "half a size"),
    ({"profile": "9g.90gb"}, "a profile no model has"),
    ({"compute_slices": 7, "memory_gb": 500}, "a size no model has"),
    ({"kind": "gpus", "profile": "7g.40gb"}, "a profile for whole GPUs"),
    ({"kind": "shared", "gpus": 2}, "two shares"),
    ({"profile": "1g.5gb", "gpus": 2}, "two MIG instances"),
])
def test_what_the_decoder_dead_letters_the_published_schema_refuses(demand: dict[str, Any], why: str) -> None:
    assert not decodes(submit_with(demand)), why
    assert not VALIDATOR.is_valid(submit_with(demand)), why


def test_the_rules_the_schema_cannot_state_are_in_its_description_and_enforced() -> None:
    for schema in SCHEMAS.values():
        assert all(rule in schema["description"] for rule in UNSTATED_RULES)
    fractional = submit_with({"kind": "gpus", "gpus": 2.0})
    assert VALIDATOR.is_valid(fractional) and not decodes(fractional)  # JSON Schema calls 2.0 an integer
    big = {**submit_with({"profile": "1g.5gb"}), "labels": {}, "workload": {"env": {"A": "x" * 8000}}}
    big["workload"]["env"].update({f"K{i}": "x" * 8000 for i in range(40)})
    assert len(json.dumps(big)) > MAX_MESSAGE_BYTES and not decodes(big)
    report = json.dumps({"v": 1, "id": "h", "node": "n2", "seq": 1, "at": 1.0}).encode()
    with pytest.raises(DecodeError, match=r"on 'n1''s subject"):
        decode("node.n1.heartbeat", report)


_SUBJECTS = {"JobSubmit": "jobs.submit", "JobCancel": "jobs.cancel", "JobExit": "jobs.exit",
             "Placed": "sched.placed", "MigrateOrder": "sched.migrate", "CapacityChanged": "sched.capacity",
             "Preempted": "sched.preempted",
             "Command": "cmd.n1", "NodeReport": "node.n1.report", "Heartbeat": "node.n1.heartbeat"}


@pytest.mark.parametrize("name", sorted(_SUBJECTS))
def test_every_message_the_published_schema_accepts_is_decoded_on_its_subject(name: str) -> None:
    assert set(_SUBJECTS) == set(SCHEMAS)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.filter_too_much])
    @given(instances(SCHEMAS[name]))
    def check(doc: dict[str, Any]) -> None:
        if "node" in doc and name in ("Command", "NodeReport", "Heartbeat"):
            doc = {**doc, "node": "n1"}  # the node of the subject (a rule the schema cannot state)
        data = json.dumps(doc).encode()
        if len(data) <= MAX_MESSAGE_BYTES:
            decode(_SUBJECTS[name], data)

    check()
