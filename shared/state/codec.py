"""Decoding what the Redis store returns, and the Lua sources: shared by ``RedisState`` and ``Batch``."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import msgspec

from shared.errors import MigschedError
from shared.state import usage
from shared.state.model import (
    HISTORY_MAX,
    HistoryEntry,
    JobRecord,
    StoredGpu,
    StoredInstance,
)

_ENC = msgspec.json.Encoder()
_INSTS = msgspec.json.Decoder(list[StoredInstance])
_HIST = msgspec.json.Decoder(HistoryEntry)
SCRIPTS = (
    "reserve",
    "enqueue",
    "settle",
    "release",
    "mark_running",
    "fail_placement",
    "cancel",
    "instance",
    "migrate",
    "node",
    "dump",
    "expire",
    "route",
    "recount_usage",
)


class StateError(MigschedError):
    """Redis refused a transition (a script error, not a lost race: races are results)."""


@functools.cache
def script_source(name: str) -> str:
    lua = resources.files("shared.state").joinpath("lua")
    return lua.joinpath("prelude.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


@functools.cache
def block_script_source() -> str:
    """``lua/block_shard.lua``, alone: it touches the namespace's block map, not a shard."""
    return resources.files("shared.state").joinpath("lua").joinpath("block_shard.lua").read_text()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None else str(v))


def decode_instances(raw: Any) -> list[StoredInstance]:
    if not raw or raw in (b"{}", b"[]", "{}", "[]"):
        return []
    return _INSTS.decode(raw)


def decode_gpu(gpu_id: str, h: dict[bytes, bytes]) -> StoredGpu | None:
    if not h:
        return None
    g = {k.decode(): v for k, v in h.items()}
    return StoredGpu(
        id=gpu_id,
        node=_s(g.get("node")),
        index=int(g.get("index", 0)),
        model=_s(g.get("model")),
        mig=g.get("mig", b"1") == b"1",
        healthy=g.get("healthy", b"1") == b"1",
        ver=int(g.get("ver", 0)),
        rev=int(g.get("rev", 0)),
        pos=int(g.get("pos", 0)),
        uuid=_s(g.get("uuid")),
        replicas=int(g.get("replicas", 0)),
        instances=decode_instances(g.get("inst")),
    )


def decode_job(job_id: str, h: dict[bytes, bytes]) -> JobRecord | None:
    if not h:
        return None
    g = {k.decode(): v for k, v in h.items()}
    return JobRecord(
        job_id=job_id,
        state=_s(g.get("state")),
        reason=_s(g.get("reason")),
        spec=g.get("spec") or b"",
        prio=int(float(g.get("prio", 0))),
        at=float(g.get("at", 0)),
        gpu=_s(g.get("gpu")),
        inst=_s(g.get("inst")),
        node=_s(g.get("node")),
        attempts=int(g.get("attempts", 0)),
        cancel=g.get("cancel") == b"1",
        mig_gpu=_s(g.get("mig_gpu")),
        mig_inst=_s(g.get("mig_inst")),
        traceparent=_s(g.get("tp")),
        updated=float(g.get("updated", 0)),
        preempted=int(g.get("preempted", 0)),
        slots=decode_slots(g.get("slots")),
        tenant=_s(g.get("tenant")),
        usage=decode_charge(g.get("usage")),
        counted=bool(g.get("charged")),
    )


def decode_charge(raw: bytes | str | None) -> dict[str, float]:
    """A job hash's ``usage`` (JSON {resource: amount}); {} when absent or unreadable, and no entry that is not a
    number."""
    try:
        got = msgspec.json.decode(raw or b"{}")
    except msgspec.DecodeError:
        return {}
    if not isinstance(got, dict):
        return {}
    return {str(k): float(v) for k, v in got.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def history_raw(job_hash: dict[Any, Any] | None, legacy: list[Any] | None = None) -> list[Any]:
    """A job's history entries (JSON), oldest first: the job hash's fields ``h<n>``, after the list an older
    version kept in ``:hist:<id>`` for a job it had written."""
    numbered = []
    for k, v in (job_hash or {}).items():
        name = k.decode() if isinstance(k, bytes) else str(k)
        if name[:1] == "h" and name[1:].isdigit():
            numbered.append((int(name[1:]), v))
    return [*(legacy or []), *(v for _, v in sorted(numbered, key=lambda nv: nv[0]))][-HISTORY_MAX:]


_SLOTS = msgspec.json.Decoder(list[tuple[str, str]])


def decode_slots(raw: Any) -> tuple[tuple[str, str], ...]:
    """A gang's ``slots`` field: JSON ``[[gpu, inst], ...]``; absent for a single-slot job."""
    if not raw or raw in (b"{}", b"[]", "{}", "[]"):
        return ()
    return tuple(_SLOTS.decode(raw))


_STOPS = msgspec.json.Decoder(list[tuple[str, str, str]])


def decode_stops(raw: Any) -> tuple[tuple[str, str, str], ...]:
    """A transition's member stops: JSON ``[[node, gpu, instance], ...]`` ('' or an empty table: none)."""
    if not raw or raw in (b"{}", b"[]", "{}", "[]"):
        return ()
    return tuple(_STOPS.decode(raw))


class CancelResult(msgspec.Struct, frozen=True, kw_only=True):
    """``status``: cancelled | stop (the job is active: stop its workload on ``node``) | noop."""

    status: str
    state: str = ""
    node: str = ""
    gpu_id: str = ""
    instance_id: str = ""


def decode_dump(raw: Any) -> tuple[list[StoredGpu], list[JobRecord], set[str], bytes, set[str],
                                   dict[str, dict[str, float]]]:
    """``lua/dump.lua``'s reply: GPUs, jobs (state, placement and charge only), the queue, the occupancy array,
    the ended jobs, the usage counters."""
    occ, raw_gpus, pend, raw_jobs, done, raw_usage = raw
    gpus = []
    for n in range(0, len(raw_gpus), 2):
        flat = raw_gpus[n + 1]
        g = decode_gpu(_s(raw_gpus[n]), dict(zip(flat[::2], flat[1::2], strict=True)))
        if g is not None:
            gpus.append(g)
    jobs = [
        JobRecord(
            job_id=_s(raw_jobs[n]),
            state=_s(raw_jobs[n + 1]),
            gpu=_s(raw_jobs[n + 2]),
            inst=_s(raw_jobs[n + 3]),
            mig_gpu=_s(raw_jobs[n + 4]),
            mig_inst=_s(raw_jobs[n + 5]),
            slots=decode_slots(raw_jobs[n + 6]),
            tenant=_s(raw_jobs[n + 7]),
            usage=decode_charge(raw_jobs[n + 8]),
            counted=bool(raw_jobs[n + 9]),
        )
        for n in range(0, len(raw_jobs), 10)
    ]
    counters = usage.decode(dict(zip(raw_usage[::2], raw_usage[1::2], strict=True)))
    return gpus, jobs, {_s(p) for p in pend}, bytes(occ or b""), {_s(d) for d in done}, counters


def decode_labels(raw: Any) -> dict[str, str]:
    """A node record's ``labels`` (JSON object, ``MIGSCHED_NODE_LABELS``); {} when absent or unreadable (an older
    registration)."""
    try:
        got = msgspec.json.decode(raw or "{}")
    except msgspec.DecodeError:
        return {}
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}
