"""The one registry of placement policies, by name: the simulator, the services and the CLI all read it.

A policy is one module in ``shared.policy.placement.plugins`` that calls ``register`` at import: its name, a
sentence on what it does, the parameters it takes, and a ``build`` that binds them into a ``PolicySpec`` (what
the engine needs to know about the policy) and its ``Rules``: where a MIG request goes and, optionally, where a
whole-GPU gang goes (``shared.policy.placement.rules``, which composes them with the rules every policy shares
into a pure ``(ClusterSnapshot, JobRequest) -> Decision``). Every module of that package is imported on first
use, so adding a file adds a policy.

Every policy also takes ``reserve`` (hold GPUs for large waiting jobs, ``shared.policy.reservation``) and
``unblock`` (move jobs to free a whole GPU for a waiting one, ``shared.policy.migration.unblock``; it works through the
reservations); their defaults are the policy's own.

A gang bigger than every node is placed by ``shared.policy.placement.gang.place_across`` whatever the policy, so that
every policy runs multi-node jobs by the same rule; a policy decides only where one-node work goes.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import msgspec

from shared.policy.placement.decision import Decision, JobRequest
from shared.policy.placement.gang import place_across, spans_nodes
from shared.policy.placement.rules import Rules, compose
from shared.policy.placement.slots import PlacementPolicy, UnknownPolicyError
from shared.policy.placement.topology import within_domains
from shared.policy.snapshot import ClusterSnapshot

__all__ = ["DEFAULT_POLICY", "PlacementPolicy", "PolicySpec", "Rules", "UnknownPolicyError", "get_policy",
           "policy_names", "register"]

DEFAULT_POLICY = "migsched"


class PolicySpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    repartitions: bool = True
    """False = static: the policy never creates or destroys instances."""
    initial_layout: str | None = None
    """A ``static_layout`` name applied to every GPU before the run, e.g. ``all-balanced``."""
    migrates: bool = False
    migrate_intra: bool = True
    """Which move kinds the migration planner may plan (``MigrationParams.intra``/``inter``)."""
    migrate_inter: bool = True
    pull_into_empty: bool = True
    consolidate: bool = False
    reserves: bool = False
    """Hold GPUs for large waiting jobs (``shared.policy.reservation``)."""
    unblocks: bool = False
    """Move the few jobs on one GPU elsewhere when that frees it for a waiting whole-GPU job
    (``shared.policy.migration.unblock``; with reservations)."""
    takes_threshold: bool = False
    """Reads the Lazy/Busy load threshold (the run's ``threshold`` is handed to it)."""


Build = Callable[[PolicySpec, dict[str, Any]], tuple[PolicySpec, Rules]]


class _Entry(msgspec.Struct, frozen=True):
    spec: PolicySpec
    accepts: tuple[str, ...]
    build: Build
    order: int


_ENTRIES: dict[str, _Entry] = {}
_LOADED = False
_ORDER = ("migsched", "paper", "paper-nomig", "paper-pack", "first-fit", "best-fit", "spread", "driver-default",
          "fgd", "static", "lb-static")
"""Listing order of the built-in policies (a plug-in not named here is listed after them, by name)."""


def register(spec: PolicySpec, accepts: tuple[str, ...] = ()) -> Callable[[Build], Build]:
    """Register ``build`` under ``spec.name``; it receives the spec and the caller's parameters (only those
    named in ``accepts``)."""

    def deco(build: Build) -> Build:
        if spec.name in _ENTRIES and _ENTRIES[spec.name].build is not build:
            raise ValueError(f"policy {spec.name!r} is registered twice")
        order = _ORDER.index(spec.name) if spec.name in _ORDER else len(_ORDER)
        _ENTRIES[spec.name] = _Entry(spec=spec, accepts=accepts, build=build, order=order)
        return build

    return deco


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    from shared.policy.placement import plugins

    for mod in pkgutil.iter_modules(plugins.__path__):
        importlib.import_module(f"{plugins.__name__}.{mod.name}")
    _LOADED = True


def policy_names() -> list[str]:
    _load()
    return [e.spec.name for e in sorted(_ENTRIES.values(), key=lambda e: (e.order, e.spec.name))]


def describe(name: str) -> PolicySpec:
    _load()
    if name not in _ENTRIES:
        raise UnknownPolicyError(f"unknown policy {name!r}; known policies: {', '.join(policy_names())}")
    return _ENTRIES[name].spec


def accepts(name: str) -> tuple[str, ...]:
    """The parameters the named policy takes (besides ``reserve``)."""
    describe(name)
    return _ENTRIES[name].accepts


def parse_label(label: str) -> tuple[str, dict[str, object]]:
    """``migsched`` or ``migsched[reserve=off,keep_empty=0]`` -> (name, params): a policy with its parameters,
    as ``migsched simulate -p`` and ``MIGSCHED_POLICY`` take it (``on`` / ``off`` are booleans)."""
    name, _, rest = label.partition("[")
    params: dict[str, object] = {}
    for item in filter(None, rest.rstrip("]").split(",")):
        k, _, v = item.partition("=")
        params[k.strip()] = _value(v.strip())
    return name, params


def _value(text: str) -> object:
    if text in ("on", "off"):
        return text == "on"
    try:
        return int(text)  # a count (``top_k``, ``max_moves``) must stay an int
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def get_labelled(label: str, **defaults: Any) -> tuple[PolicySpec, PlacementPolicy]:
    """``get_policy`` of a label (``parse_label``): its own parameters over ``defaults``."""
    name, params = parse_label(label)
    return get_policy(name, **{**defaults, **params})


def get_policy(name: str, **params: Any) -> tuple[PolicySpec, PlacementPolicy]:
    """The named policy with its parameters bound; an unknown name or parameter raises UnknownPolicyError."""
    entry = _ENTRIES.get(name) if _LOADED else None
    if entry is None:
        describe(name)
        entry = _ENTRIES[name]
    reserve = params.pop("reserve", None)
    unblock = params.pop("unblock", None)
    extra = sorted(set(params) - set(entry.accepts))
    if extra:
        takes = ", ".join((*entry.accepts, "reserve", "unblock"))
        raise UnknownPolicyError(f"policy {name!r} takes no parameter(s) {', '.join(extra)}; it takes: {takes}")
    spec, rules = entry.build(entry.spec, params)
    policy = _with_gangs(spec.name, compose(spec.name, rules))
    if reserve is not None:
        spec = msgspec.structs.replace(spec, reserves=bool(reserve))
    if unblock is not None:
        spec = msgspec.structs.replace(spec, unblocks=bool(unblock))
    return spec, policy


def _with_gangs(name: str, policy: PlacementPolicy) -> PlacementPolicy:
    def anywhere(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if spans_nodes(snap, job.demand):
            return place_across(snap, job, name)
        return policy(snap, job)

    @functools.wraps(policy)  # keeps what the engine reads off a policy (``balancer_params``)
    def placed(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if job.domains and job.demand.kind == "gpus":
            return within_domains(snap, job, anywhere)
        return anywhere(snap, job)

    return placed
