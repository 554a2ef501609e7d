"""One settings object per service, parsed from ``MIGSCHED_*`` environment variables.

Every field's default is the documented default (README "Configuration"); the variable name is
``MIGSCHED_`` + the field name in upper case (``batch`` -> ``MIGSCHED_BATCH``). Parsing is strict: a value
that does not convert to the field's type raises ``SettingsError`` naming the variable, so a typo fails at
start-up rather than as a strange behaviour later.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from shared.errors import MigschedError


class SettingsError(MigschedError, ValueError):
    """An environment variable does not parse into its setting's type."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What every service (and the client, the CLI and the tests) needs to reach NATS and Redis."""

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server(s), comma-separated; ``nats://user:password@host:port`` logs in (the replies then come on that
    user's own inboxes, as the shipped permissions require)."""
    nats_password_file: str = ""
    """A file holding the password of the user ``nats_url`` names (a mounted Secret), instead of a password in
    the URL."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis, the single source of truth: redis://, rediss:// or unix://; redis+sentinel://host:port,...\
/service for the primary that Sentinel names (failover without a restart); or redis+cluster://host:port,... for a \
Redis Cluster (each shard's keys in one slot)."""
    redis_wait_replicas: int = 0
    """After each round trip of transitions, wait (Redis ``WAIT``) until this many replicas hold it before acting
    on it: a failover then cannot lose a transition whose command went out. Fewer within
    ``redis_wait_timeout_s`` is an outage (retried). 0: do not wait (replication stays asynchronous)."""
    redis_wait_timeout_s: float = 1.0
    """How long a round trip waits for ``redis_wait_replicas`` replicas."""
    connect_give_up_s: float = 10.0
    """How long the command line (submit, cancel, replay, dlq) and the Python client try to reach NATS before
    they fail with the reason; 0: until a server answers. Services always wait for NATS to come up."""
    namespace: str = ""
    """Isolates one deployment (or one test): '' uses the plain names (stream JOBS, subject jobs.submit,
    Redis keys ``{migsched:0}:...``); 'x' gives streams ``x_JOBS``, subjects ``x.jobs.submit`` and Redis keys
    ``{x:0}:...``."""
    shards: int = 1
    """Scheduling cells in Redis, the same in every process of a deployment: the first service to start records
    its count, a service started with another refuses to, and the command line reads the recorded one. A node
    with a ``block`` label lives in its block's shard (a new block gets the shard holding the fewest blocks), one
    without in crc32(name) % shards; a job in crc32(job_id) % shards, or, when that shard could never host it, or
    cannot place it now, in a shard that can; it is placed only on its shard's GPUs. Run no more shards than
    blocks, so that every shard holds nodes."""
    max_attempts: int = 3
    """Placements of one job that may fail (on executors, or unplannable) before the job is failed for good."""
    stream_storage: str = "file"
    """JetStream storage: 'file' (survives a NATS restart) or 'memory'."""
    stream_replicas: int = 1
    """JetStream replicas per stream (1 for a single server; 3 on a NATS cluster, of nats-server 2.11 or later:
    an older server's replicated consumer can skip a message when its leader changes)."""
    stream_max_age_s: float = 86400.0
    """How long JetStream keeps messages (limits retention); the dedupe window is ``dup_window_s``."""
    dup_window_s: float = 0.0
    """JetStream ``Nats-Msg-Id`` duplicate window; 0: twice ``MIGSCHED_ACK_WAIT_S`` (60 s). A handler whose
    publishes failed gets its message back after the ack wait and publishes the same ids again, stored once
    inside the window; longer costs nats-server memory for every id (500 jobs/s: ~300 MB and growing at 120 s,
    ~200 MB flat at 60 s)."""
    max_deliver: int = 5
    """Deliveries of one message before it goes to ``dlq.<subject>``."""
    ack_wait_s: float = 30.0
    """A delivered message not acked within this is redelivered (a crashed consumer's batch comes back)."""
    batch: int = 256
    """Most messages one consumer fetch hands to a handler."""
    batch_linger_s: float = 0.002
    """How long a consumer that has fewer than ``batch`` messages waits for more before handing them over (0:
    at once): a burst becomes one handler call, one Redis round trip and one flush. 2 ms cut the stack's CPU at
    500 jobs/s by 5.3-6.5 % (two alternating pairs), for at most 2 ms more per hop. 0.005 cut it 8.7 % over a
    10-minute soak at 1,000 jobs/s of 1.28-s jobs (p50 the same, p90 halved), but with 40-ms jobs on 2 x 8 GPUs
    the stack then sustained 891 instead of 989 jobs/s: worth raising for jobs that run seconds or more."""
    background_linger_s: float = -1.0
    """The linger of the consumers off the submit -> command path, each a batch of what a node reports or is
    told: the executor's commands, the node registry's reports and heartbeats, the migration planner's exit
    hints (negative: ``batch_linger_s``). A trade of CPU for slot time: a job's start and its release may each
    come this much later, so its slot is held up to twice as long beyond its run. At 1,000 jobs/s of 1.28-s
    jobs (steady-1000-64x8) 0.02 cut the whole stack's CPU by 5-15 % (two alternating 60-s pairs; 5-10 % over
    10-minute soaks), but with 40-ms jobs (steady-1000-2x8) it cut the rate the stack sustains from 978.6 to
    736.1 jobs/s (0.005: 886.4/s, for 1.6 % less CPU on 64 x 8). Worth setting for jobs that run seconds or
    more at high arrival rates; by default nothing lingers longer."""
    fetch_timeout_s: float = 0.05
    """How often an idle consumer wakes to check for a stop (>= 0.2 s); its pull requests stay open 100 times
    as long (1-30 s), so a message is handed over as soon as it arrives either way."""
    publish_timeout_s: float = 10.0
    """How long a batch of publishes waits for JetStream's acknowledgements before it fails (and its handler's
    messages come back)."""
    otlp_endpoint: str = ""
    """OTLP/HTTP traces endpoint (e.g. http://127.0.0.1:4318/v1/traces); empty disables export."""
    trace_sample_ratio: float = 1.0
    """Share of new traces sampled (parent-based: a sampled submit keeps its whole trace)."""
    log_level: str = "INFO"
    """Python logging level of the service."""
    metrics_port: int = 0
    """Prometheus endpoint port; 0 disables it. Services override the default (9101-9103)."""
    geometry_file: str = ""
    """Overrides/extends the built-in MIG geometry (also read by ``shared.mig.geometry``)."""

    @property
    def off_path_linger_s(self) -> float:
        """``background_linger_s``, or ``batch_linger_s`` when that is negative."""
        return self.background_linger_s if self.background_linger_s >= 0 else self.batch_linger_s

    @property
    def duplicate_window_s(self) -> float:
        """The streams' ``Nats-Msg-Id`` duplicate window: ``dup_window_s``, or twice the ack wait when 0."""
        return self.dup_window_s if self.dup_window_s > 0 else 2 * self.ack_wait_s

    @property
    def redelivery_horizon_s(self) -> float:
        """How long after a job ended a message may still name it: a delivery unacked ``max_deliver`` times
        over, plus the duplicate window of a republish. The cap never forgets a job younger than this."""
        return self.duplicate_window_s + self.max_deliver * self.ack_wait_s


def check_policy(label: str) -> None:
    """Refuse a ``MIGSCHED_POLICY`` that names no policy, or a parameter the policy does not take, at start."""
    from shared.policy.placement.registry import UnknownPolicyError, get_labelled  # loads the policy plugins

    try:
        get_labelled(label)
    except UnknownPolicyError as exc:
        raise SettingsError(f"MIGSCHED_POLICY={label!r}: {exc}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BalancerSettings(Settings):
    metrics_port: int = 9101
    policy: str = "migsched"
    """Placement policy, by name (``migsched simulate --help`` lists them): ``migsched`` packs and aligns
    expected ends; ``paper`` is the seeds' Lazy/Busy balancer. Parameters go in brackets, as ``migsched simulate
    -p`` takes them: ``migsched[keep_empty=0]`` spreads small jobs while any GPU is empty (shorter waits for them
    beside gangs across nodes, more rejections on MIG-only traces: docs/results.md), ``first-fit[reserve=on]``
    holds GPUs for large jobs. With a tenancy file, the same policy places the jobs its quota check admits."""
    reserve_after_s: float = 1200.0
    """A policy that reserves holds GPUs for a large job (whole GPUs) that fits on one node once it has waited
    this long, for a gang bigger than every node at once; later jobs may use them only if their duration hint
    ends first."""
    max_reservations: int = 2
    """Holds per shard at once; more holds drain more GPUs for large jobs and idle more slices meanwhile."""
    reserve_slack_s: float = 0.0
    """A job may take a held GPU if its duration hint ends at most this long after the hold's expected start
    (relaxed backfill): the held job may start up to this much later, and the queue behind it moves sooner.
    0 = only jobs that end before the start."""
    default_hint_s: float = 0.0
    """How long a job submitted without ``duration_hint_s`` is expected to run, for planning alone (Slurm's
    DefaultTime): its GPUs count as freeing then when a hold plans which GPUs a large job waits for, and a
    placement aligns with that end. 0 = its end is unknown and no hold counts on its GPUs. It never stops the
    job, and such a job still may not use held GPUs."""
    threshold: float = 0.4
    """Lazy/Busy load threshold ``t``."""
    dynamic: bool = True
    """Create MIG instances on demand (False: reuse existing idle instances only)."""
    top_k: int = 3
    """Runner-up candidates explained in each placement (1 = the winner only; each costs policy time)."""
    align_minute_s: float = 60.0
    """One minute of the clock the ``migsched`` policy aligns expected ends on (its time buckets are minutes on a
    log-2 scale). Only a replay at speed-up S changes it, to 60 / S (``up --demo`` does)."""
    max_rounds: int = 3
    """Re-decisions of a job that lost a compare-and-set race, within one batch, before it waits in the queue.
    """
    backfill_batch: int = 256
    """Pending jobs examined per backfill pass, in priority-then-age order."""
    retry_backoff_s: float = 0.25
    """A job re-queued after a refused placement (or a lost node) waits this long before it is decided again,
    twice as long after each further one, up to ``retry_backoff_max_s``: the refusal's drift registration, or
    the stop it set off, lands first, instead of the same slot being chosen again until ``max_attempts`` runs
    out. 0 retries at once."""
    retry_backoff_max_s: float = 5.0
    """The longest wait between two placements of one job (``retry_backoff_s``)."""
    mirror_refresh_s: float = 10.0
    """Full reload of the local cluster mirror from Redis (conflicts also reload the GPUs concerned)."""
    tenancy_file: str = ""
    """The tenancy file (TOML: quotas, cohorts, priority classes; docs/operations.md, Tenancy), hot-reloaded. Empty: no
    quotas, no preemption, placement as before."""
    reserve_full: int = 0
    """GPUs kept able to host a full-size job (docs/operations.md, Tenancy §6; the seeds advise 1). Applies only with a
    tenancy file; 0 turns the reserve off."""
    tenancy_poll_s: float = 2.0
    """How often the tenancy file's mtime/size is checked for a hot reload."""

    def __post_init__(self) -> None:
        if self.retry_backoff_s < 0 or self.retry_backoff_max_s < 0:
            raise SettingsError("MIGSCHED_RETRY_BACKOFF_S and MIGSCHED_RETRY_BACKOFF_MAX_S must be >= 0")
        if not self.align_minute_s > 0:
            raise SettingsError("MIGSCHED_ALIGN_MINUTE_S must be > 0")
        if not self.reserve_slack_s >= 0:
            raise SettingsError("MIGSCHED_RESERVE_SLACK_S must be >= 0")
        if not self.default_hint_s >= 0:
            raise SettingsError("MIGSCHED_DEFAULT_HINT_S must be >= 0 (0: no default)")
        check_policy(self.policy)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegistrySettings(Settings):
    metrics_port: int = 9102
    node_timeout_s: float = 15.0
    """A node whose heartbeats stop this long is marked lost and its jobs re-queued."""
    cmd_timeout_s: float = 120.0
    """A command without a result this long is treated as failed."""
    retention_window_s: float = 300.0
    """Recent-demand window of the keep-or-destroy policy for idle instances."""
    retention_min_share: float = 0.05
    """Keep an idle instance when its profile is at least this share of recent demand."""
    job_retention_s: float = 86400.0
    """How long a finished, failed, cancelled or rejected job (its record and history) is kept in Redis before
    the node registry deletes it; 0 keeps them forever. The default is the streams' default max age, so a
    redelivered message never finds its job forgotten."""
    job_retention_max: int = 1_000_000
    """Most ended jobs kept per shard, whatever their age (0: no cap): beyond it the oldest go first, but never
    one that ended within the duplicate window + ``MIGSCHED_MAX_DELIVER`` x ``MIGSCHED_ACK_WAIT_S`` (210 s
    by default), while a redelivered message may still name it. An ended job costs Redis ~1.6 KB, so at 1,000
    jobs/s a day's retention alone would need ~140 GB; the cap bounds it to ~1.6 GB per shard."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MigrationPlannerSettings(Settings):
    metrics_port: int = 9103
    policy: str = "migsched"
    """The placement policy the stack runs, with its parameters (``MIGSCHED_POLICY``, as the balancer's); the
    planner orders moves only for one that migrates (``paper``, ``paper-pack``)."""
    threshold: float = 0.4
    """Lazy/Busy load threshold ``t`` (the same variable as the balancer's)."""
    cooldown_s: float = 120.0
    """A job moved less than this long ago is not moved again."""
    max_moves: int = 4
    """Most moves per plan (per exit gathered, and per defragmentation pass)."""
    intra: bool = True
    """Allow moves within one GPU (on Busy GPUs)."""
    inter: bool = True
    """Allow moves between GPUs (pulls into Lazy GPUs; never for latency-sensitive jobs)."""
    defrag_interval_s: float = 300.0
    """Period of the whole-cluster defragmentation pass; 0 disables it."""
    on_exit: bool = True
    """Plan moves after job exits."""
    plan_interval_s: float = 0.5
    """Exits are gathered for this long and planned together (one shard read per interval, not per exit)."""
    plan_interval_max_s: float = 4.0
    """After an after-exit pass that ordered no move the next one waits twice as long, up to this; a pass that
    orders a move goes back to ``plan_interval_s``. Each pass reads the whole shard: at 1,000 exits/s of jobs
    too short to move, one every 0.5 s cost the planner ~11 % of a core in 20-160 ms bursts. Set it to
    ``plan_interval_s`` for no back-off."""
    min_left_s: float = 30.0
    """A job whose duration hint says it ends within this many seconds is not moved: its exit gives the room
    back about as soon as the move would (``shared.policy.migration.payoff``); 0 moves any job."""

    def __post_init__(self) -> None:
        check_policy(self.policy)


S = TypeVar("S", bound=Settings)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _convert(name: str, raw: str, kind: Any) -> Any:
    try:
        if kind is bool:
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return raw
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


def load(cls: type[S], env: Mapping[str, str] | None = None, **overrides: Any) -> S:
    """``cls`` with each field from ``MIGSCHED_<FIELD>`` when set, then ``overrides`` (tests, the CLI)."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        var = "MIGSCHED_" + f.name.upper()
        if var in env:
            values[f.name] = _convert(var, env[var], hints[f.name])
    values.update(overrides)
    obj = cls(**values)
    if obj.shards < 1:
        raise SettingsError("MIGSCHED_SHARDS must be >= 1")
    if obj.batch < 1 or obj.max_deliver < 1:
        raise SettingsError("MIGSCHED_BATCH and MIGSCHED_MAX_DELIVER must be >= 1")
    return obj


def describe(cls: type[Settings]) -> list[tuple[str, str, str]]:
    """(variable, default, doc) for every field: the README's configuration table is generated from this."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for a, b in itertools.pairwise(body):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[a.target.id] = " ".join(b.value.value.split())
    return [
        ("MIGSCHED_" + f.name.upper(), repr(f.default), docs.get(f.name, "")) for f in dataclasses.fields(cls)
    ]
