"""Hypothesis strategies for the instances of a JSON Schema: the subset of draft 2020-12 that ``migsched schema``
publishes (``$ref`` into ``$defs``, ``type``, ``enum``, ``const``, ``anyOf``, ``oneOf``, bounds, lengths,
patterns, ``propertyNames``, ``additionalProperties``). hypothesis-jsonschema does this in general but does not
run on the Hypothesis this project pins (it calls internals Hypothesis has since renamed); a keyword outside the
subset raises, so a schema that grows one is noticed here rather than sampled wrongly."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import strategies as st

_KNOWN = {"$ref", "$defs", "$schema", "title", "description", "default", "type", "enum", "const", "anyOf", "oneOf",
          "discriminator", "properties", "required", "additionalProperties", "propertyNames", "maxProperties",
          "items", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength",
          "pattern"}
_TEXT = st.characters(blacklist_categories=("Cs",))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.text(_TEXT, max_size=5))
MAX_ITEMS = 4
"""Arrays and free-form maps are cut to this many entries: a message stays well under its byte limit."""


def instances(root: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Every instance ``root`` accepts may be drawn (within ``MAX_ITEMS``), and only such instances."""
    return _of(root, root)


def _of(schema: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[Any]:
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"schema keyword(s) not handled: {sorted(unknown)}")
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return _of(root["$defs"][name], root)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "oneOf" in schema:
        check = jsonschema.Draft202012Validator({**schema, "$defs": root.get("$defs", {})})
        return st.one_of([_of(b, root) for b in schema["oneOf"]]).filter(check.is_valid)
    if "anyOf" in schema:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if "type" not in rest:
            return st.one_of([_of(b, root) for b in schema["anyOf"]])
        # constraints on a typed schema: draw within one branch, merged into the properties it narrows
        return st.one_of([_of(_narrowed(rest, b), root) for b in schema["anyOf"]])
    return _typed(schema, root)


def _narrowed(schema: dict[str, Any], branch: dict[str, Any]) -> dict[str, Any]:
    props = {k: {**v, **branch.get("properties", {}).get(k, {})} for k, v in schema["properties"].items()}
    return {**schema, "properties": props}


def _typed(schema: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[Any]:
    t = schema.get("type")
    if t == "null":
        return st.none()
    if t == "boolean":
        return st.booleans()
    if t == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if t == "number":
        low = schema.get("exclusiveMinimum", schema.get("minimum"))
        return st.floats(low, schema.get("maximum"), exclude_min="exclusiveMinimum" in schema, allow_nan=False,
                         allow_infinity=False)
    if t == "string":
        return _string(schema)
    if t == "array":
        items = _of(schema.get("items", {}), root) if schema.get("items") else _SCALARS
        return st.lists(items, min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
    if t == "object":
        return _object(schema, root)
    raise ValueError(f"schema type not handled: {t!r}")


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if "pattern" not in schema:
        return st.text(_TEXT, min_size=low, max_size=high)
    return st.from_regex(schema["pattern"], fullmatch=True).filter(
        lambda s: low <= len(s) and (high is None or len(s) <= high))


def _object(schema: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    fixed = st.fixed_dictionaries(
        {k: _of(v, root) for k, v in props.items() if k in required},
        optional={k: _of(v, root) for k, v in props.items() if k not in required},
    )
    extra_values = schema.get("additionalProperties", True)
    if extra_values is False:
        return fixed
    names = _string({"type": "string", **schema["propertyNames"]}) if "propertyNames" in schema else st.text(
        _TEXT, max_size=8)
    values = _of(extra_values, root) if isinstance(extra_values, dict) else _SCALARS
    cap = min(schema.get("maxProperties", MAX_ITEMS), MAX_ITEMS)
    extras = st.dictionaries(names.filter(lambda n: n not in props), values, max_size=cap)
    return st.tuples(fixed, extras).map(lambda fe: {**fe[1], **fe[0]})
