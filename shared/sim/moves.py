"""Migration execution: the moves a plan asks for, made before broken, one after the other.

The planner (``shared.policy.migration.planner``) decides; this module only applies its moves to the simulated state
with their time and work costs (docs/simulator.md, "Migration").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from shared.policy.migration.gate import no_moves_after_exit
from shared.policy.migration.moves import MigrationParams
from shared.policy.placement.decision import Slot
from shared.sim import events as ev
from shared.sim.jobs import RUNNING

if TYPE_CHECKING:
    from shared.sim.config import SimConfig
    from shared.sim.run import SimRun, Spec


def migration_params(spec: Spec, cfg: SimConfig) -> MigrationParams:
    """The planner's parameters for a policy that migrates: the run's thresholds, the policy's kinds of move."""
    return MigrationParams(
        threshold=cfg.threshold, cooldown_s=cfg.cooldown_s, max_moves=cfg.max_moves,
        intra=getattr(spec, "migrate_intra", True), inter=getattr(spec, "migrate_inter", True),
        pull_into_empty=getattr(spec, "pull_into_empty", True), consolidate=getattr(spec, "consolidate", False),
    )


class InFlight:
    """A move under way: source instance, reserved destination, and the token its done-event carries."""

    __slots__ = ("dst", "ops", "src", "token")

    def __init__(self, src: str, dst: str, token: int) -> None:
        self.src, self.dst, self.token = src, dst, token
        self.ops = 0


def after_exit(sim: SimRun, gpu_id: str) -> tuple[Any, ...]:
    """The planner's moves after a job left ``gpu_id``. Most exits provably plan none
    (``migration.gate``): those are answered from the kept pull index (and, on a Busy GPU, the defragmentation
    screen's intra bound), without a snapshot or a plan. The others get a snapshot that skips the builder
    (``planner_snapshot``): with the pull index, a plan after an exit reads GPUs, not columns (a
    consolidation's few columns are derived from the base ones on first read)."""
    assert sim.mig is not None
    c, params = sim.cluster, sim.mig_params
    pulls = c.current_pulls(sim.now)
    if pulls is None:
        return sim.mig.plan_after_exit(c.snapshot(), gpu_id, sim.now, params)
    if no_moves_after_exit(c.views[gpu_id], c.models[gpu_id], c.model_list, pulls, sim.now, params,
                           c.model_ids, c.screen):
        return ()
    snap = c.planner_snapshot()
    pulls.follow(snap)
    return sim.mig.plan_after_exit(snap, gpu_id, sim.now, params, pulls=pulls)


def on_move_done(sim: SimRun, e: ev.Event) -> bool:
    i = e.job
    mv = sim.moving[i]
    if mv is None or mv.token != e.epoch or sim.state[i] != RUNNING:
        return False
    sim.moving[i] = None
    sim.advance(i)
    # the switch stops the job for the downtime and rolls it back to its last checkpoint
    done = sim.jobs[i].duration + sim.out.lost[i] - sim.work[i]
    ckpt = sim.cfg.checkpoint_s
    lost = sim.cfg.migration_downtime_s * sim.speed[i] + (done % ckpt if ckpt > 0 else 0.0)
    sim.work[i] += lost
    sim.out.lost[i] += lost
    sim.out.migrations[i] += 1
    sim.insts[i] = (mv.dst,)
    sim.cluster.update(mv.dst, started_at=sim.now)
    sim.free(mv.src, i)
    sim.join(i, mv.dst)
    sim.after_free()
    continue_chain(sim, i)
    return True


def on_defrag(sim: SimRun, e: ev.Event) -> bool:
    assert sim.mig is not None
    sim.q.push(sim.now + sim.cfg.defrag_interval_s, ev.DEFRAG)
    # the planner is a pure function of the state and of time only through cooldowns: an unchanged state
    # that gave no moves, with no cooldown running then, gives no moves now either
    memo = sim.defrag_memo
    if (
        memo is not None
        and memo[0] == sim.cluster.changes
        and memo[1] - sim.last_move_at >= sim.cfg.cooldown_s
    ):
        return True
    c = sim.cluster
    pulls, screen = c.current_pulls(sim.now), c.defrag_screen()
    if pulls is not None and screen is not None and screen.no_moves(pulls, sim.now):
        moves: tuple[Any, ...] = ()  # provably what the planner would plan: no snapshot, no plan
    else:
        moves = sim.mig.plan_defrag(c.snapshot(), sim.now, sim.mig_params, pulls=c.pull_index(sim.now))
    sim.defrag_memo = None if moves else (sim.cluster.changes, sim.now)
    start_chain(sim, moves)
    return True


def start_chain(sim: SimRun, moves: tuple[Any, ...]) -> None:
    """Moves of one plan assume the previous ones completed, so they run one after the other."""
    pending = list(moves)
    while pending:
        m = pending.pop(0)
        i = try_move(sim, m)
        if i >= 0:
            if pending:
                sim.chain[i] = pending
            return


def continue_chain(sim: SimRun, i: int) -> None:
    pending = sim.chain.pop(i, None)
    if pending:
        start_chain(sim, tuple(pending))


def try_move(sim: SimRun, m: Any) -> int:
    i = sim.index.get(m.job_id, -1)
    if i < 0 or sim.state[i] != RUNNING or sim.moving[i] is not None or sim.insts[i] != (m.src_instance,):
        sim.moves_skipped += 1
        return -1
    slot = Slot(
        gpu_id=m.dst_gpu,
        node=sim.cluster.gpu(m.dst_gpu).node,
        model=sim.cluster.gpu(m.dst_gpu).model,
        profile=m.dst_profile,
        start=m.dst_start,
        size=m.dst_size,
        compute=0,
        action="create",
        destroy=m.destroy,
    )
    sim.out.token += 1
    src = sim.cluster.instance(m.src_instance)
    # the job keeps its expected end wherever it runs
    tmpl = msgspec.structs.replace(sim.template(i), last_moved_at=sim.now,
                                   ends_at=src.ends_at if src is not None else None)
    got = sim.cluster.try_apply(slot, tmpl, f"{m.job_id}~m{sim.out.token}")
    if got is None:
        sim.moves_skipped += 1
        return -1
    dst, ops = got
    sim.cluster.update(m.src_instance, last_moved_at=sim.now)
    sim.last_move_at = sim.now
    mv = InFlight(m.src_instance, dst, sim.out.token)
    sim.moving[i] = mv
    done = sim.ops_ready(m.dst_gpu, ops) + sim.cfg.migration_downtime_s
    sim.q.push(done, ev.MIGRATION_DONE, i, mv.token)
    sim.moves_started += 1
    return i
