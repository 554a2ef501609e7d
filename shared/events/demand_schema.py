"""The published JSON Schema of a job's demand: one variant per kind, each with the fields it requires and the
values some GPU model serves, so that a demand the schema accepts is one the decoder accepts and the other way
round (``tests/unit/test_demand_contract.py`` checks both directions).

On the wire the demand stays one msgspec Struct (``shared.policy.request.Demand``) whose ``kind`` defaults to
``mig``: a tagged union of Structs would require the tag, and the MIG demands published without ``kind`` must stay
valid (schemas only grow). The rules that Struct checks after decoding (``Demand.check`` and the geometry's
profiles, ``codec.check_demand``) are stated here instead, as four variants under ``oneOf``:

- ``mig`` by profile: ``profile`` is the name of a profile some model has (with or without the
  ``nvidia.com/mig-`` prefix) or a shape some model has (``3g``, ``1g+me``); no size fields;
- ``mig`` by size: ``compute_slices`` and ``memory_gb`` both, within the largest profile (media extensions
  apart) of some model; no ``profile``;
- ``gpus``: ``gpus`` whole GPUs; no profile or compute slices;
- ``shared``: one time-sliced share; no profile or compute slices.

The profile names and sizes are the geometry's, so the schema is published for a geometry (the default one in
``schemas/``; ``migsched schema`` prints the one its settings load).
"""

from __future__ import annotations

from typing import Any

from shared.mig.geometry import Geometry
from shared.policy.request import _PREFIX, GB_PER_GIB, MAX_GANG, Demand, resolve_profile

_NULL: dict[str, Any] = {"type": "null"}
_ONE: dict[str, Any] = {"const": 1}
_MEMORY: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0, "maximum": 4096}


def servable_profiles(geometry: Geometry) -> list[str]:
    """Every ``profile`` string some model of ``geometry`` resolves: names and shapes, bare and prefixed."""
    words = {w for m in geometry.models for p in m.profiles for w in (p.name, p.shape)}
    spelled = {s for w in words for s in (w, _PREFIX + w)}
    return sorted(s for s in spelled
                  if any(resolve_profile(Demand(profile=s), m) is not None for m in geometry.models))


def size_limits(geometry: Geometry) -> list[tuple[int, float]]:
    """The (compute slices, decimal GB) of every profile a sized request may resolve to, none dominated by
    another: a size is servable when it is within one of them (the bound ``resolve_profile`` compares with)."""
    boxes = {(p.compute_slices, p.memory_gib * GB_PER_GIB + 1e-9)
             for m in geometry.models for p in m.profiles if not p.media_extensions}
    return sorted(b for b in boxes if not any(o != b and o[0] >= b[0] and o[1] >= b[1] for o in boxes))


def _variant(title: str, kind: dict[str, Any], props: dict[str, Any], required: list[str],
             description: str) -> dict[str, Any]:
    base: dict[str, Any] = {"profile": _NULL, "compute_slices": _NULL, "memory_gb": _NULL, "gpus": _ONE}
    return {"title": title, "description": description, "type": "object",
            "properties": {"kind": kind, **base, **props}, "required": required}


def demand_schema(geometry: Geometry) -> dict[str, Any]:
    """The ``Demand`` definition: exactly one of the four variants."""
    size_boxes = [{"properties": {"compute_slices": {"maximum": c}, "memory_gb": {"maximum": gb}}}
                  for c, gb in size_limits(geometry)]
    optional_memory = {"anyOf": [_MEMORY, _NULL]}  # read and ignored: a whole GPU or a share has all of it
    by_profile = _variant(
        "MigByProfile", {"const": "mig"}, {"profile": {"enum": servable_profiles(geometry)}}, ["profile"],
        "One MIG instance of a named profile or shape. `kind` may be left out (it defaults to mig).")
    by_size = _variant(
        "MigBySize", {"const": "mig"},
        {"compute_slices": {"type": "integer", "minimum": 1, "maximum": 8}, "memory_gb": _MEMORY},
        ["compute_slices", "memory_gb"],
        "One MIG instance of the smallest profile with at least these compute slices and decimal GB. `kind` may "
        "be left out (it defaults to mig).")
    by_size["anyOf"] = size_boxes
    gpus = _variant(
        "Gpus", {"const": "gpus"},
        {"gpus": {"type": "integer", "minimum": 1, "maximum": MAX_GANG}, "memory_gb": optional_memory}, ["kind"],
        "Whole GPUs: on one node when one node has that many, else across as few nodes as possible.")
    shared = _variant("Shared", {"const": "shared"}, {"memory_gb": optional_memory}, ["kind"],
                      "One time-sliced share of a GPU that is not in MIG mode.")
    return {
        "title": "Demand",
        "description": "What a job asks for: exactly one of the variants. A field set to null counts as left "
                       "out; fields not listed are ignored.",
        "type": "object",
        "oneOf": [by_profile, by_size, gpus, shared],
    }
