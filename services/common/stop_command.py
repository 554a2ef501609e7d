"""A ``stop`` command: the one shape the balancer (a preempted gang's other parts) and the node registry (runs
the state did not expect, a gang's other parts) send."""

from __future__ import annotations

from shared.events import Command


def stop_command(
    node: str, job: str | None, cid: str, gpu: str | None, iid: str | None, now: float, *, only_that_run: bool,
    started_by: str | None = None,
) -> Command:
    """A ``stop`` of ``job`` on ``node`` for a run the state did not expect there; ``only_that_run``: the
    executor ends the job only where it runs on ``iid`` (``src_instance_id``), not a current run elsewhere;
    ``started_by``: only the run that command started (``src_cmd_id``)."""
    tail = gpu.rsplit("/", 1)[-1] if gpu else ""
    cid = cid[:200]
    return Command(
        id=cid,
        cmd_id=cid,
        kind="stop",
        node=node,
        gpu_id=gpu,
        gpu_index=int(tail) if tail.isdigit() else None,
        instance_id=iid,
        src_instance_id=iid if only_that_run else None,
        src_cmd_id=started_by,
        job_id=job,
        at=now,
    )
