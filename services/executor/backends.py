"""Backend factory: the executor service builds its backend here from its settings.

``sim``: simulated GPUs of the given models. ``nvml``: the node's real GPUs through pynvml (``models`` is then
only a cross-check: the GPUs NVML reports win). Extra ``options`` go to the backend's constructor (for nvml:
``state_dir``, ``env_allowlist``, ``destroy_foreign``, ``in_use_retry_s``, ``stop_grace_s``, ``confirm_s``,
``nvml`` (a module, e.g. the fake); for sim: ``mig_disabled``, ``geometry``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.executor.backend import Backend

KINDS = ("sim", "nvml")


def make_backend(
    kind: str,
    *,
    node: str,
    models: Sequence[str],
    reconfig_latency_s: float = 0.15,
    speedup: float = 1.0,
    **options: Any,
) -> Backend:
    if kind == "sim":
        from services.executor.sim_backend import SimBackend

        return SimBackend(
            node=node, models=models, reconfig_latency_s=reconfig_latency_s, speedup=speedup, **options
        )
    if kind == "nvml":
        # imported lazily: the sim stack never loads NVML code paths
        from services.executor.nvml_backend import NvmlBackend

        return NvmlBackend(node=node, expected_models=models, **options)
    raise ValueError(f"unknown executor backend {kind!r}; expected one of {', '.join(KINDS)}")
