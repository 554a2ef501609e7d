"""The ids and ``stop`` commands the registry's parts share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.events import Command


def place_attempt(cmd_id: str, job_id: str) -> int | None:
    """The attempt a place command was sent for (``services.common.place_command.place_cmd_id``:
    ``place:<job>:<attempt>``, or ``place:<job>:<attempt>/<node rank>`` for one member node of a gang across
    nodes); None for any other id (then no command is judged late)."""
    head, _, tail = cmd_id.rpartition(":")
    attempt, _, rank = tail.partition("/")
    ok = head == f"place:{job_id}" and attempt.isdigit() and (not rank or rank.isdigit())
    return int(attempt) if ok else None


def member_stops(job: str, stops: Iterable[Sequence[str]], now: float) -> list[Command]:
    """A ``stop`` for each other node of a gang across nodes that must end ((node, gpu id, instance id) each):
    the state holds that node's part ``retiring`` until the stop's ``cmd_done`` or the part's exit
    (``node_stopped``). Only the run on that instance, so that a later placement of the job elsewhere on the node
    runs on. The id carries the time: a later end of the same job on the same node is another stop."""
    return [
        stop_command(node, job, f"stop:{job}:member:{node}:{int(now * 1000)}", gpu, iid, now, only_that_run=True)
        for node, gpu, iid in stops
    ]


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
