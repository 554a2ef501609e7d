"""Jobs that ended long ago are deleted from Redis (``lua/expire.lua``): every ``EXPIRE_EVERY_S``, those ended
longer than ``job_retention_s`` ago, and the oldest beyond ``job_retention_max`` per shard."""

from __future__ import annotations

import time

from services.common.service import Context
from services.registry import metrics as m

EXPIRE_EVERY_S = 2.0
"""Sweeps come often and small: at 1,000 jobs/s a sweep every 30 s deleted 30,000 jobs in one burst of Redis
time; every 2 s it deletes ~2,000, in calls of ``EXPIRE_LIMIT``, and costs one short read when nothing is due."""
EXPIRE_LIMIT = 250
"""Jobs one expire call deletes at most: one script never blocks Redis long (~2 ms here; the sweep calls again
while a call deleted this many, so a backlog drains within one sweep, between other clients' commands)."""


PRUNE_EVERY_S = 60.0
"""Routes of expired jobs are looked for at most this often: a pass reads every route (one per job its home
shard could not take), so each sweep would cost more than the expiry it follows."""


class Expiry:
    def __init__(self, ctx: Context) -> None:
        self.state = ctx.state
        self.settings = ctx.settings
        self.log = ctx.log
        self._prune_at = 0.0

    async def expire_jobs(self) -> int:
        """Delete the jobs of every shard that ended more than ``job_retention_s`` ago, and the oldest beyond
        ``job_retention_max`` that ended before the redelivery horizon -> how many."""
        st = self.settings
        now = time.time()
        before = now - st.job_retention_s if st.job_retention_s > 0 else 0.0  # 0: no job ended before 1970
        settled = now - st.redelivery_horizon_s
        total = 0
        for shard in range(st.shards):
            while (n := await self.state.expire(shard, before, EXPIRE_LIMIT, st.job_retention_max, settled)) > 0:
                total += n
                if n < EXPIRE_LIMIT:
                    break
        if total and st.shards > 1 and time.monotonic() >= self._prune_at:
            # the routes of jobs gone (a route outlives its job's record): each route is checked, so not often
            self._prune_at = time.monotonic() + PRUNE_EVERY_S
            await self.state.prune_routes(settled)
        if total:
            m.JOBS_EXPIRED.inc(total)
            self.log.info("expired %d ended job(s) (retention %.0f s, at most %d kept per shard)", total,
                          st.job_retention_s, st.job_retention_max)
        return total
