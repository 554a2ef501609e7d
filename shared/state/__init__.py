"""Cluster state: Redis is the single source of truth.

- ``RedisState`` (``redis_store``): the real store; every transition one Lua script (``lua/``) with a
  compare-and-set on the GPU's version; ``batch()`` pipelines many transitions in one round trip.
- ``MemoryState`` (``memory_store``): the same interface and semantics in process memory, for unit tests only.
- ``model``: stored GPUs/instances/jobs, transition inputs and results; ``keys``: the Redis key layout;
  ``sharding``: which shard a node, a block or a job lives in.
- ``check``: the invariant audit behind ``migsched check``.

Job lifecycle: pending -> placing -> running -> (migrating -> running ->) finished | failed | cancelled |
rejected; lost/preempted jobs go back to pending. Every transition appends {at, from, to, reason} to the job's
history. A job in a terminal state is listed with when it ended (``{ns:s}:done``) and deleted, history included,
by ``expire`` once that is older than the retention (the node registry's sweep, ``MIGSCHED_JOB_RETENTION_S``).
"""

from shared.state.batch import Batch
from shared.state.check import audit, check_state
from shared.state.codec import CancelResult, StateError
from shared.state.keys import Keys
from shared.state.model import (
    ACTIVE_STATES,
    JOB_STATES,
    TERMINAL_STATES,
    Eviction,
    HistoryEntry,
    JobRecord,
    PlacementFailure,
    ReleaseResult,
    Reservation,
    ReserveResult,
    SlotReservation,
    StoredGpu,
    StoredInstance,
    Violation,
    gpu_id_of,
)
from shared.state.redis_store import RedisState
from shared.state.sharding import empty_shard, shard_of

__all__ = [
    "ACTIVE_STATES",
    "JOB_STATES",
    "TERMINAL_STATES",
    "Batch",
    "CancelResult",
    "Eviction",
    "HistoryEntry",
    "JobRecord",
    "Keys",
    "PlacementFailure",
    "RedisState",
    "ReleaseResult",
    "Reservation",
    "ReserveResult",
    "SlotReservation",
    "StateError",
    "StoredGpu",
    "StoredInstance",
    "Violation",
    "audit",
    "check_state",
    "empty_shard",
    "gpu_id_of",
    "shard_of",
]
