"""The ids and ``stop`` commands the registry's parts share."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from services.common.stop_command import stop_command
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


def part_stops(stops: Iterable[Sequence[str]], now: float) -> list[Command]:
    """``member_stops`` of the gangs a node's loss or registration re-queued: ``node.lua`` lists each other
    node's part as (job, gpu id, instance id, node)."""
    return [c for job, gpu, iid, node in stops for c in member_stops(job, [(node, gpu, iid)], now)]
