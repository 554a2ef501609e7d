"""Encoding and decoding: ``decode`` validates a message against its subject's schema plus the semantic checks
(``check_demand``, a node speaks only for itself); ``json_schemas`` exports every external schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from shared.events.commands import Command
from shared.events.demand_schema import demand_schema
from shared.events.envelope import DecodeError
from shared.events.jobs import JobCancel, JobExit, JobSubmit
from shared.events.node import Heartbeat, NodeReport
from shared.events.sched import CapacityChanged, MigrateOrder, Placed, Preempted
from shared.events.subjects import Subjects
from shared.mig.geometry import Geometry, default_geometry
from shared.policy.request import Demand, resolve_profile

_TYPES: dict[str, Any] = {
    "submit": JobSubmit,
    "cancel": JobCancel,
    "exit": JobExit,
    "placed": Placed,
    "migrate": MigrateOrder,
    "capacity": CapacityChanged,
    "preempted": Preempted,
    "cmd": Command,
    "report": NodeReport,
    "heartbeat": Heartbeat,
}
_DECODERS = {k: msgspec.json.Decoder(t) for k, t in _TYPES.items()}
_ENCODER = msgspec.json.Encoder()
MAX_MESSAGE_BYTES = 256 * 1024


def encode(msg: msgspec.Struct) -> bytes:
    return _ENCODER.encode(msg)


_SERVABLE: dict[Demand, Geometry] = {}
"""Demands found coherent and servable, with the geometry that serves them: a submit's demand is one of a few,
and its check (profile resolution on every model) costs more than the rest of the decode."""


def check_demand(demand: Demand, geometry: Geometry | None = None) -> None:
    """Raise DecodeError unless the demand is coherent and some known GPU model can serve it."""
    geometry = geometry or default_geometry()
    if _SERVABLE.get(demand) is geometry:
        return
    from shared.errors import RequestError

    try:
        demand.check()
    except RequestError as exc:
        raise DecodeError(f"invalid demand: {exc}") from None
    if demand.kind == "mig" and not any(resolve_profile(demand, m) is not None for m in geometry.models):
        raise DecodeError(f"unknown profile: no GPU model has a profile for {demand.label()}")
    if len(_SERVABLE) >= 4096:  # bounded against a stream of distinct sized demands
        _SERVABLE.clear()
    _SERVABLE[demand] = geometry


def decode(
    subject: str, data: bytes, subjects: Subjects | None = None, geometry: Geometry | None = None
) -> Any:
    """The message on ``subject``, validated; ``DecodeError`` with a specific reason otherwise.

    Semantic checks beyond the schema: a submit's demand is coherent and servable by a known GPU model; a node
    message's ``node`` matches the node token of its subject (an executor cannot speak for another node).
    """
    subjects = subjects or _DEFAULT_SUBJECTS
    kind, node = subjects.kind_of(subject)
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}", subject)
    try:
        msg = _DECODERS[kind].decode(data)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"invalid: {exc}", subject) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed JSON: {exc}", subject) from None
    except RecursionError:  # adversarial nesting ([[[[...]]]]): msgspec gives up past the recursion limit
        raise DecodeError("malformed JSON: nested too deeply", subject) from None
    if kind == "submit":
        try:
            check_demand(msg.demand, geometry)
        except DecodeError as exc:
            raise DecodeError(exc.reason, subject) from None
    elif node is not None and getattr(msg, "node", node) != node:
        raise DecodeError(f"node {msg.node!r} in a message on {node!r}'s subject", subject)
    return msg


_DEFAULT_SUBJECTS = Subjects("")

EXTERNAL: Mapping[str, Any] = {
    "JobSubmit": JobSubmit,
    "JobCancel": JobCancel,
    "JobExit": JobExit,
    "Placed": Placed,
    "MigrateOrder": MigrateOrder,
    "CapacityChanged": CapacityChanged,
    "Preempted": Preempted,
    "Command": Command,
    "NodeReport": NodeReport,
    "Heartbeat": Heartbeat,
}


UNSTATED_RULES = (
    f"A message is at most {MAX_MESSAGE_BYTES} bytes.",
    "An integer is written without a fraction or exponent (5, not 5.0).",
    "A node's message names the node of its subject (node.<node>.*, cmd.<node>).",
)
"""What the decoder enforces that JSON Schema cannot state: each schema's description lists them."""


def json_schemas(geometry: Geometry | None = None) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of every message, keyed by message name, for ``migsched schema``; a demand's
    profiles and sizes are those of ``geometry`` (the default one unless given)."""
    demand = demand_schema(geometry or default_geometry())
    out: dict[str, Any] = {}
    for name, t in EXTERNAL.items():
        schema = msgspec.json.schema(t)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema.setdefault("title", name)
        if "Demand" in schema.get("$defs", {}):
            schema["$defs"]["Demand"] = demand
        schema["description"] = "Beyond this schema: " + " ".join(UNSTATED_RULES)
        out[name] = schema
    return out
