"""The Redis key layout of one shard. Every key carries the shard's hash tag ``{<ns>:<shard>}`` so that
all keys a transition touches live in one Redis Cluster slot.

=========================  ======  ===========================================================================
key                        type    content
=========================  ======  ===========================================================================
``{ns:s}:gpus``            zset    GPU id -> position (its byte in ``occ``); the shard's GPU index
``{ns:s}:gpu:<gpu_id>``    hash    node, index, model, uuid, mig, replicas (time-slice shares of a non-MIG
                                   GPU), healthy, pos, ver (CAS), inst (JSON array)
``{ns:s}:occ``             string  one byte per GPU position: the busy mask (non-idle instances)
``{ns:s}:job:<job_id>``    hash    state, reason, spec (JobSubmit JSON), prio, at, gpu, inst, node, attempts,
                                   cancel, mig_gpu, mig_inst, updated, slots (a gang: JSON [[gpu, inst], ...]),
                                   late (",<attempt>,...": place commands whose late run was stopped),
                                   ra ("<attempts>:<attempt>": the earlier attempt whose late run the
                                   current placement took as its own), tenant, usage (JSON {resource:
                                   amount}: its quota charge), charged ("1" while counted in ``:usage``),
                                   hn and h<n> (its history, below)
``{ns:s}:hist:<job_id>``   list    an older version's history of the job (read, deleted with the job); the job
                                   hash now keeps it: ``h<n>`` = JSON {at, from, to, reason} of its n-th
                                   transition (the last 64), ``hn`` = how many so far
``{ns:s}:jobs``            set     every job id known to the shard (audit)
``{ns:s}:done``            zset    jobs in a terminal state (finished, failed, cancelled, rejected; cancel
                                   tombstones too), score = when they got there: ``lua/expire.lua`` deletes
                                   those older than the retention (``MIGSCHED_JOB_RETENTION_S``), and the
                                   oldest beyond ``MIGSCHED_JOB_RETENTION_MAX``, with their hash and
                                   history, ``:jobs`` included, a bounded batch per call
``{ns:s}:pending``         zset    pending job ids, score (1000 - priority) * 1e10 + submitted_at
``{ns:s}:cmds``            hash    command id -> JSON {node, kind, job, gpu, at}: commands in flight
``{ns:s}:placing``         zset    jobs in placing, score = when they entered it (lost-placement sweep)
``{ns:s}:nodes``           set     node names
``{ns:s}:node:<node>``     hash    state (up|lost), last_seen, registered_at, lost_at, gpus (JSON ids)
``{ns:s}:routes``          hash    job id -> "<shard>:<routed at>": jobs whose home is this shard (crc32 of the
                                   id) that live in another, because no set of this shard's GPUs could ever
                                   host them (``lua/route.lua``); the registry prunes those whose job is gone
``{ns:s}:holds``           string  JSON {at, holds}: the GPUs the balancer's last backfill pass held for large
                                   waiting jobs (``shared.policy.reservation``), for ``migsched status``
``{ns:s}:usage``           hash    "<tenant>\t<resource>" -> amount: the quota charges of the shard's active
                                   jobs, added by ``lua/reserve.lua`` (which checks a placement's
                                   ``limits`` against them), taken off when a job leaves the active states
=========================  ======  ===========================================================================

``ns`` is ``MIGSCHED_NAMESPACE`` or ``migsched`` when that is empty. One key lies outside every shard:
``{ns:blocks}`` (hash), block label -> the shard its nodes live in (``lua/block_shard.lua``).
"""

from __future__ import annotations


class Keys:
    __slots__ = ("cmds", "done", "gpus", "holds", "jobs", "nodes", "occ", "pending", "placing", "routes", "shard",
                 "tag", "usage")

    def __init__(self, namespace: str, shard: int) -> None:
        self.shard = shard
        self.tag = f"{{{namespace or 'migsched'}:{shard}}}"
        t = self.tag
        self.gpus = f"{t}:gpus"
        self.occ = f"{t}:occ"
        self.pending = f"{t}:pending"
        self.cmds = f"{t}:cmds"
        self.nodes = f"{t}:nodes"
        self.jobs = f"{t}:jobs"
        self.placing = f"{t}:placing"
        self.done = f"{t}:done"
        self.holds = f"{t}:holds"
        self.routes = f"{t}:routes"
        self.usage = f"{t}:usage"

    def gpu(self, gpu_id: str) -> str:
        return f"{self.tag}:gpu:{gpu_id}"

    def job(self, job_id: str) -> str:
        return f"{self.tag}:job:{job_id}"

    def hist(self, job_id: str) -> str:
        return f"{self.tag}:hist:{job_id}"

    def node(self, node: str) -> str:
        return f"{self.tag}:node:{node}"
