"""Long gangs wait for headroom: the ``migsched`` rule for a multi-GPU job that would hold a large share of the
cluster for a long time.

On the openb traces a few 8-GPU jobs run for a day or more on clusters of 28-44 GPUs. Started while the cluster
is busy, each holds a whole node for its run, and the single-GPU jobs that arrive meanwhile are turned away by
the hundred, far more work in count than the gang is. So a gang is *long* when its GPU-time (GPUs × duration
hint) exceeds ``gang_hours`` hours of every GPU of the cluster, and a long gang starts only while at least
``gang_room`` of the cluster's GPUs stay empty after it starts. One that has waited ``gang_wait_s`` is placed,
and held for, as any gang: where patience is long (the multi-node jobs of a training cluster) it is served in
turn, not starved. A gang without a hint is never long: nothing is known of its length. ``gang_hours`` 0 turns
the rule off.

No reservation is planned for a gang this rule keeps waiting (holding GPUs for a job that would then not start
idles them for nothing): the policy's ``CannotPlace`` says ``deferred``, and the simulator's queue asks
``waits`` itself.

Pure: the caller hands in the counts, the hint and the clock.
"""

from __future__ import annotations

from shared.policy.placement.alignment import AlignParams


def is_long(params: AlignParams, gpus: int, hint_s: float | None, cluster: int) -> bool:
    """Whether a gang of ``gpus`` with this hint takes more than ``gang_hours`` of a cluster of ``cluster``
    GPUs (never for one GPU, a job without a hint, or with the rule off)."""
    return (params.gang_hours > 0 and gpus >= 2 and hint_s is not None
            and gpus * hint_s > params.gang_hours * 3600.0 * cluster)


def waits(params: AlignParams, gpus: int, hint_s: float | None, waited_s: float | None, empty: int,
          cluster: int) -> str | None:
    """Why a gang of ``gpus`` waits now (``empty``: the cluster's usable GPUs with nothing running, ``cluster``:
    all its GPUs, ``waited_s``: since its submission, None when unknown), or None when it may be placed."""
    if not is_long(params, gpus, hint_s, cluster):
        return None
    if waited_s is not None and waited_s >= params.gang_wait_s:
        return None
    keep = params.gang_room * cluster
    if empty - gpus >= keep:
        return None
    assert hint_s is not None  # is_long
    return (f"a long gang ({gpus} GPUs for {hint_s / 3600:.1f} h, more than {params.gang_hours:g} h of the "
            f"cluster's {cluster} GPUs) waits until {keep:.0f} GPU(s) stay empty after it starts "
            f"({empty} empty now) or it has waited {params.gang_wait_s:.0f} s")
