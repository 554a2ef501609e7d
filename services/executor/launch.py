"""How a gang's part on this node starts: the processes of a ``place`` command with ``gang``, each with the GPUs
it sees and the environment torchrun- and MPI-style launchers read.

``per-gpu`` (the default): one process per GPU, ``CUDA_VISIBLE_DEVICES`` its one GPU, ``RANK`` the global rank of
that GPU, ``LOCAL_RANK`` its place on the node. ``per-node``: one process with all of the node's GPUs, ``RANK``
the global rank of the node's first GPU and ``LOCAL_RANK`` 0 (its launcher starts the per-GPU workers). Both
get ``WORLD_SIZE`` (GPUs in the gang), ``LOCAL_WORLD_SIZE`` (GPUs on this node), ``NODE_RANK``, ``NNODES``,
``MASTER_ADDR``, ``MASTER_PORT`` and ``MIGSCHED_GANG_HOSTS`` (every member node, in rank order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from shared.events import GangLaunch


class Proc(msgspec.Struct, frozen=True, kw_only=True):
    """One process of a gang's part: the GPUs it sees (indexes on this node) and the variables it gets."""

    gpus: tuple[int, ...]
    env: Mapping[str, str]


WORKLOAD_MAY_SET = frozenset({"MASTER_PORT"})
"""Gang variables a workload's own environment overrides (a port it needs)."""


def gang_procs(gang: GangLaunch, gpus: Sequence[int]) -> tuple[Proc, ...]:
    """The processes of this node's part of ``gang`` on ``gpus`` (the command's plain slots, in rank order)."""
    shared = {
        "WORLD_SIZE": str(gang.world_size),
        "LOCAL_WORLD_SIZE": str(len(gpus)),
        "NODE_RANK": str(gang.node_rank),
        "NNODES": str(len(gang.hosts)),
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
        "MIGSCHED_GANG_HOSTS": ",".join(gang.hosts),
    }
    if gang.launch == "per-node":
        return (Proc(gpus=tuple(gpus), env={**shared, "RANK": str(gang.first_rank), "LOCAL_RANK": "0"}),)
    return tuple(
        Proc(gpus=(g,), env={**shared, "RANK": str(gang.first_rank + i), "LOCAL_RANK": str(i)})
        for i, g in enumerate(gpus)
    )


def proc_env(workload_env: Mapping[str, str], proc: Proc) -> dict[str, str]:
    """A process's variables: the gang's, over the workload's own but for those it may set itself."""
    env = dict(proc.env)
    env.update({k: v for k, v in workload_env.items() if k in WORKLOAD_MAY_SET})
    return env
