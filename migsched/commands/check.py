"""``migsched check``: audit the invariants of a live Redis; exit non-zero with a readable list of violations.

What is checked (``shared.state.check`` plus the cross-key checks below, each shard read by one read-only
Lua script so a live system cannot change under the read):

- no two instances of a GPU overlap; every instance is a legal placement of a known profile; no profile
  exceeds its max count; the occupancy byte equals the busy mask (``shared.state.check.audit``);
- every job is in exactly one known state: ``pending`` exactly when queued, ``placing`` exactly when in the
  placing set (``placing``), and an active job holds the instance it names (``reservation``/``orphan``);
- with several shards, every shard holds a node once any does: a job is placed only on its own shard's GPUs, so
  the jobs of a shard without one would wait for nothing (``shard``), every topology block's nodes live in
  one shard (``block``), and every job recorded outside its home shard is routed there by its home, and none
  recorded at home is routed away (``route``);
- with ``--executors SECONDS``: the reservations match what the executors report (their heartbeats' running
  jobs, listened to for that long): a job the state has running on a node that the node does not run, or a
  workload a node runs that the state does not have running there (``executor``).

Read-only on purpose: it works as the ``audit`` Redis user (``shared/access.py``: read commands and
``EVAL_RO``/``EVALSHA_RO`` only), so scripts run with ``EVAL_RO`` and nothing is ever loaded or written.

Exit status: 0 clean, 1 violations found, 2 the audit could not run (connection, permission).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import click

from migsched import endpoints
from shared.errors import MigschedError
from shared.mig.geometry import default_geometry
from shared.settings import Settings, load
from shared.state import RedisState, Violation, empty_shard, shard_of
from shared.state.check import audit
from shared.state.codec import _s, decode_labels, decode_slots, script_source
from shared.state.job_routes import route_shard

ACTIVE = ("placing", "running", "migrating")

# One consistent read of what ``audit`` does not cover: the placing set against the jobs' states, and where
# every active job runs (node, last change) for the executor cross-check. Read-only (EVAL_RO).
_EXTRA = """
local P = string.sub(KEYS[1], 1, -6)
local placing = redis.call('ZRANGE', P .. ':placing', 0, -1)
local jobs = {}
for _, id in ipairs(redis.call('SMEMBERS', P .. ':jobs')) do
  local f = redis.call('HMGET', P .. ':job:' .. id, 'state', 'node', 'updated', 'inst', 'slots')
  table.insert(jobs, id)
  for n = 1, 3 do table.insert(jobs, f[n] or '') end
  table.insert(jobs, (f[5] == false or f[5] == '') and (f[4] or '') or '')  -- a gang's parts are not compared
  table.insert(jobs, f[5] or '')  -- a gang's slots: the nodes it runs on
end
return {placing, jobs}
"""


class CheckError(MigschedError):
    """The audit could not run (Redis unreachable, a permission missing, NATS unreachable)."""


class _EvalRo:
    """Stands in for a redis-py ``Script``: runs the source with EVAL_RO (no SCRIPT LOAD, no write)."""

    def __init__(self, redis: Any, source: str) -> None:
        self.redis = redis
        self.source = source

    async def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
        return await self.redis.eval_ro(self.source, len(keys), *keys, *args)


class ReadOnlyState(RedisState):
    """A ``RedisState`` whose scripts run with EVAL_RO: fit for the ``audit`` user (reads only)."""

    def script(self, name: str) -> Any:
        s = self._scripts.get(name)
        if s is None:
            s = self._scripts[name] = _EvalRo(self.redis, script_source(name))
        return s


async def cross_checks(
    state: RedisState, shard: int
) -> tuple[list[Violation], dict[str, tuple[str, str, float]], dict[str, str], dict[str, frozenset[str]]]:
    """Placing-set violations of one shard, job -> (state, node, updated) for every known job, job -> its
    instance for the jobs that hold one (not gangs), and job -> its nodes for the gangs."""
    k = state.keys(shard)
    placing_raw, raw_jobs = await state.redis.eval_ro(_EXTRA, 1, k.gpus)
    placing = {_s(p) for p in placing_raw}
    jobs: dict[str, tuple[str, str, float]] = {}
    insts: dict[str, str] = {}
    gangs: dict[str, frozenset[str]] = {}
    for n in range(0, len(raw_jobs), 6):
        upd = _s(raw_jobs[n + 3])
        try:
            at = float(upd) if upd else 0.0
        except ValueError:
            at = 0.0
        job = _s(raw_jobs[n])
        jobs[job] = (_s(raw_jobs[n + 1]), _s(raw_jobs[n + 2]), at)
        if raw_jobs[n + 4]:
            insts[job] = _s(raw_jobs[n + 4])
        if raw_jobs[n + 5]:
            gangs[job] = frozenset(g.rpartition("/")[0] for g, _ in decode_slots(_s(raw_jobs[n + 5])))
    out: list[Violation] = []
    for job, (st, _node, _at) in sorted(jobs.items()):
        if st == "placing" and job not in placing:
            out.append(
                Violation(kind="placing", subject=job, detail="state placing but not in the placing set")
            )
        if st != "placing" and job in placing:
            out.append(Violation(kind="placing", subject=job, detail=f"state {st} but in the placing set"))
    for job in sorted(placing - set(jobs)):
        out.append(Violation(kind="placing", subject=job, detail="in the placing set but unknown"))
    return out, jobs, insts, gangs


def shard_checks(nodes: Sequence[int], waiting: Sequence[int]) -> list[Violation]:
    """A shard that holds no node while another does (``shared.state.empty_shard``): the jobs recorded in it
    cannot be placed until one registers there. ``nodes``, ``waiting``: each shard's registered nodes and
    pending jobs."""
    out = []
    for s, n in enumerate(waiting):
        why = empty_shard(s, nodes)
        if why is not None:
            out.append(Violation(kind="shard", subject=f"shard {s}", detail=f"{why}; {n} job(s) wait there"))
    return out


def route_checks(recorded: Sequence[set[str]], routes: Sequence[Mapping[str, str]]) -> list[Violation]:
    """Jobs that transitions would not find (``recorded``: each shard's job ids; ``routes``: each shard's
    ``:routes``, job -> "<shard>:<at>"): a job recorded outside its home shard (crc32 of its id) that its home
    does not route there, or one recorded at home that its home routes elsewhere (then recorded twice, or
    looked for in the wrong shard)."""
    shards = len(recorded)
    out = []
    for s, jobs in enumerate(recorded):
        for job in sorted(jobs):
            home = shard_of(job, shards)
            raw = routes[home].get(job)
            routed = route_shard(raw, shards, home) if raw is not None else home
            if routed != s:
                where = f"routes it to shard {routed}" if raw is not None else "has no route for it"
                out.append(Violation(kind="route", subject=job,
                                     detail=f"recorded in shard {s}, but its home shard {home} {where}: "
                                            f"its transitions go to shard {routed}"))
    return out


def block_checks(by_shard: Sequence[Mapping[str, Mapping[str, str]]]) -> list[Violation]:
    """A topology block whose nodes live in more than one shard (``by_shard``: each shard's node records, with
    their ``labels`` JSON): a gang kept within the block is placed on one shard's nodes only. A block's nodes
    follow its first node's shard, so this takes nodes registered before the block map was (or that were
    relabelled without their records removed)."""
    where: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for s, nodes in enumerate(by_shard):
        for node, h in nodes.items():
            block = decode_labels(h.get("labels")).get("block")
            if block:
                where[block][s].append(node)
    out = []
    for block, shards in sorted(where.items()):
        if len(shards) > 1:
            parts = " and ".join(f"{s} ({', '.join(sorted(ns))})" for s, ns in sorted(shards.items()))
            out.append(Violation(kind="block", subject=f"block {block}", detail=(
                f"its nodes live in shards {parts}: a gang kept within the block is placed on one shard's nodes "
                "only; remove the records of the nodes outside the block's shard and let them register again")))
    return out


def executor_checks(
    jobs: dict[str, tuple[str, str, float]],
    heartbeats: dict[str, list[tuple[float, set[str]]]],
    lost_nodes: set[str],
    margin_s: float = 1.0,
    *,
    slots: Mapping[str, Mapping[str, str]] | None = None,
    insts: Mapping[str, str] | None = None,
    gangs: Mapping[str, frozenset[str]] | None = None,
) -> list[Violation]:
    """Compare the state with what each node reported. ``heartbeats``: node -> [(received at, running)];
    ``slots``: node -> job -> where its last heartbeat runs it (``slot_text``); ``insts``: job -> the state's
    instance id (``<gpu id>:<profile>@<start>:...``); ``gangs``: job -> every node a gang runs on (each runs its
    part; ``jobs`` names the first).

    Only what is settled is judged: a job whose state changed after the node's first heartbeat of the window
    (minus ``margin_s``) may legitimately still be on its way, and a lost node is not expected to report."""
    out: list[Violation] = []
    slots, insts, gangs = slots or {}, insts or {}, gangs or {}

    def nodes_of(job: str, node: str) -> frozenset[str]:
        return gangs.get(job) or frozenset((node,))

    for node, beats in sorted(heartbeats.items()):
        if not beats or node in lost_nodes:
            continue
        first = min(t for t, _ in beats) - margin_s
        last_running = max(beats, key=lambda b: b[0])[1]
        always = set.intersection(*(r for _, r in beats))
        for job, (st, jnode, at) in sorted(jobs.items()):
            if st in ("running",) and node in nodes_of(job, jnode) and at < first and job not in last_running:
                out.append(
                    Violation(
                        kind="executor",
                        subject=job,
                        detail=f"running on {node} per the state, but {node}'s heartbeat does not list it",
                    )
                )
        for job in sorted(always):
            st, jnode, at = jobs.get(job, ("unknown", "", 0.0))
            if at >= first:
                continue
            if st not in ACTIVE or node not in nodes_of(job, jnode):
                where = f" on {', '.join(sorted(nodes_of(job, jnode)))}" if jnode and st in ACTIVE else ""
                out.append(
                    Violation(
                        kind="executor",
                        subject=job,
                        detail=f"{node} runs it, but the state has it {st}{where}",
                    )
                )
        for job, on in sorted(slots.get(node, {}).items()):  # a MIG job on another instance than the state's
            st, jnode, at = jobs.get(job, ("unknown", "", 0.0))
            expected = _state_slot(insts.get(job, ""))
            if st == "running" and jnode == node and at < first and expected is not None and on != expected:
                out.append(Violation(kind="executor", subject=job, detail=(
                    f"{node} runs it on GPU {on.replace(':', ' ', 1)}, but the state has it on {insts[job]}")))
    return out


def slot_text(gpu_index: int, profile: str, start: int) -> str:
    """Where a job runs on its node, as ``executor_checks`` compares it: ``<GPU index>:<profile>@<start>``."""
    return f"{gpu_index}:{profile}@{start}"


def _state_slot(inst: str) -> str | None:
    """``slot_text`` of a state instance id (``<node>/<index>:<profile>@<start>:...``); None if it is not one."""
    gpu, _, rest = inst.partition(":")
    index, where = gpu.rpartition("/")[2], rest.partition(":")[0]
    return f"{index}:{where}" if index.isdigit() and "@" in where else None


async def listen_heartbeats(
    nats_url: str, namespace: str, seconds: float
) -> tuple[dict[str, list[tuple[float, set[str]]]], dict[str, dict[str, str]]]:
    """Every node's heartbeats (core NATS subscription, as the audit NATS user may) for ``seconds``: node ->
    [(received at, running)], and node -> job -> where its latest heartbeat runs it (``slot_text``)."""
    import nats

    from shared.events import DecodeError, Subjects, decode

    subjects = Subjects(namespace)
    got: dict[str, list[tuple[float, set[str]]]] = defaultdict(list)
    slots: dict[str, dict[str, str]] = {}

    async def on(msg: Any) -> None:
        try:
            hb = decode(msg.subject, msg.data, subjects)
        except DecodeError:
            return
        got[hb.node].append((time.time(), set(hb.running)))
        slots[hb.node] = {s.job_id: slot_text(s.gpu_index, s.profile, s.start) for s in hb.slots}

    try:
        servers = [u.strip() for u in nats_url.split(",") if u.strip()]  # a cluster's list, as the services take it
        nc = await nats.connect(servers, name="migsched-check", connect_timeout=5, max_reconnect_attempts=1)
    except Exception as exc:
        raise CheckError(f"cannot reach NATS at {endpoints.safe_url(nats_url)}: {exc!r}") from None
    try:
        await nc.subscribe(subjects.node_heartbeats, cb=on)
        await asyncio.sleep(seconds)
    finally:
        await nc.close()
    return dict(got), slots


async def run_check(
    redis_url: str, namespace: str, shards: int | None = None, nats_url: str = "", executors_s: float = 0.0
) -> list[Violation]:
    """Every violation found on the live state of ``namespace`` (empty: all invariants hold). ``shards``: the
    deployment's count, or None for the one its services recorded."""
    import redis.exceptions as rex

    from shared.state.deployment import ShardCountMismatch, open_reader

    geometry = default_geometry()
    state: ReadOnlyState | None = None
    try:
        state = await open_reader(ReadOnlyState, load(Settings, env={}, redis_url=redis_url, namespace=namespace),
                                  shards)
        shards = state.shards
        beats, slots = await listen_heartbeats(nats_url, namespace, executors_s) if executors_s > 0 else ({}, {})
        out = list(await audit(state, geometry))
        jobs: dict[str, tuple[str, str, float]] = {}
        insts: dict[str, str] = {}
        gangs: dict[str, frozenset[str]] = {}
        waiting: list[int] = []
        recorded: list[set[str]] = []
        for shard in range(shards):
            extra, js, ins, gs = await cross_checks(state, shard)
            out.extend(extra)
            jobs.update(js)
            gangs.update(gs)
            insts.update(ins)
            recorded.append(set(js))
            waiting.append(sum(1 for st, _, _ in js.values() if st == "pending"))
        if shards > 1:
            routes = [{_s(j): _s(v) for j, v in (await state.redis.hgetall(state.keys(s).routes)).items()}
                      for s in range(shards)]
            out.extend(route_checks(recorded, routes))
        by_shard = [await state.nodes(s) for s in range(shards)] if shards > 1 or executors_s > 0 else []
        out.extend(shard_checks([len(ns) for ns in by_shard], waiting))
        out.extend(block_checks(by_shard))
        if executors_s > 0:
            lost = {n for ns in by_shard for n, h in ns.items() if h.get("state") == "lost"}
            out.extend(executor_checks(jobs, beats, lost, slots=slots, insts=insts, gangs=gangs))
        return out
    except ShardCountMismatch as exc:
        raise CheckError(str(exc)) from None
    except rex.NoPermissionError as exc:
        raise CheckError(f"the Redis user may not run the audit's reads: {exc}") from None
    except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
        raise CheckError(f"cannot reach Redis at {endpoints.safe_url(redis_url)}: {exc}") from None
    except rex.ResponseError as exc:
        raise CheckError(f"Redis refused the audit: {exc}") from None
    finally:
        if state is not None:
            await state.close()



def render(violations: Sequence[Violation], namespace: str) -> str:
    where = f"namespace {namespace!r}" if namespace else "the default namespace"
    if not violations:
        return f"OK: every invariant holds in {where}."
    lines = [f"FAIL: {len(violations)} violation(s) in {where}:"]
    by_kind: dict[str, list[Violation]] = defaultdict(list)
    for v in violations:
        by_kind[v.kind].append(v)
    for kind in sorted(by_kind):
        lines.append(f"  {kind} ({len(by_kind[kind])}):")
        lines += [f"    - {v.subject}: {v.detail}" for v in by_kind[kind]]
    return "\n".join(lines)


def as_json(violations: Sequence[Violation], namespace: str) -> str:
    return json.dumps(
        {
            "namespace": namespace,
            "ok": not violations,
            "violations": [{"kind": v.kind, "subject": v.subject, "detail": v.detail} for v in violations],
        },
        indent=2,
    )


@click.command("check")
@endpoints.options
@click.option("--json", "as_json_", is_flag=True, help="Print {namespace, ok, violations: [...]} as JSON.")
@click.option("--shards", type=int, default=None,
              help="Shards of the deployment (default: MIGSCHED_SHARDS, else the count its services recorded).")
@click.option(
    "--executors",
    "executors_s",
    type=float,
    default=0.0,
    show_default=True,
    help="Also listen to the executors' heartbeats for this many seconds and compare what they run.",
)
def command(
    nats_url: str, redis_url: str, namespace: str, as_json_: bool, shards: int | None, executors_s: float
) -> None:
    """Verify the invariants on the live state; exit 1 with the list of violations, 2 when it cannot run."""
    try:
        found = asyncio.run(run_check(redis_url, namespace, endpoints.configured_shards(shards), nats_url,
                                      executors_s))
    except CheckError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(as_json(found, namespace) if as_json_ else render(found, namespace))
    sys.exit(1 if found else 0)
