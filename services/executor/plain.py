"""Workloads on GPUs that are not in MIG mode: a whole GPU (every GPU of a gang) or one time-sliced share.

No MIG operation happens: a ``place`` command with ``plain`` slots binds the workload to the GPUs themselves,
``CUDA_VISIBLE_DEVICES=GPU-<uuid>[,GPU-<uuid>...]``. The binding is an ``InstanceInfo`` whose ``gpus`` lists
the GPUs, so the job table and the backends treat it like any instance: ``(gpu_index, gi_id)`` names it, with a
pseudo GI id per replica above every real one (so two shares of one GPU are two instances, and a whole GPU is
replica 0). A time-sliced share has no memory or fault isolation: every share sees the whole GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.executor.backend import BackendError, GpuInfo, InstanceInfo
from shared.events import Command

PLAIN_GI = 2048
"""Pseudo GI ids of plain bindings start here (NVML GI ids are below 1024)."""


def plain_target(cmd: Command, gpus: Sequence[GpuInfo]) -> InstanceInfo:
    """The binding a ``place`` command with ``plain`` slots asks for; BackendError when a GPU is unknown or in
    MIG mode (a whole-GPU job or a share never runs on a MIG GPU: it would see no device or a foreign one)."""
    by_index = {g.index: g for g in gpus}
    uuids = []
    for s in cmd.plain:
        g = by_index.get(s.gpu_index)
        if g is None:
            raise BackendError(f"{cmd.cmd_id}: this node has no GPU {s.gpu_index}")
        if g.mig_enabled:
            raise BackendError(
                f"{cmd.cmd_id}: GPU {s.gpu_index} is in MIG mode; a {s.profile} job needs a GPU that is not"
            )
        uuids.append(g.uuid)
    first = cmd.plain[0]
    shared = first.profile == "shared"
    if shared and len(cmd.plain) != 1:
        raise BackendError(f"{cmd.cmd_id}: a time-sliced share takes one GPU, not {len(cmd.plain)}")
    return InstanceInfo(
        gpu_index=first.gpu_index,
        gi_id=PLAIN_GI + (first.replica if shared else 0),
        ci_id=None,
        profile_id=0,
        profile=first.profile,
        start=first.replica if shared else 0,
        size=0,
        uuid=",".join(uuids),
        gpus=tuple(s.gpu_index for s in cmd.plain),
    )


def check_plain(info: InstanceInfo, gpus: Sequence[GpuInfo]) -> None:
    """A backend's guard before it starts a plain binding: every GPU exists and is not in MIG mode."""
    by_index = {g.index: g for g in gpus}
    for i in info.gpus:
        g = by_index.get(i)
        if g is None:
            raise BackendError(f"no GPU {i} on this node")
        if g.mig_enabled:
            raise BackendError(f"GPU {i} is in MIG mode: a whole-GPU or time-sliced job cannot run on it")
