"""NVML return codes -> typed backend errors with a message an operator can act on.

Both backends use this table (the sim backend's fault knobs take NVML codes too), so the executor handles one
error vocabulary whatever runs underneath.
"""

from __future__ import annotations

from services.executor import nvml_codes
from services.executor.backend import (
    BackendError,
    BackendUnavailableError,
    InsufficientResourcesError,
    InUseError,
    NotMigModeError,
    PermissionDeniedError,
)

# code -> (error class, what it means for an operator)
_TABLE: dict[int, tuple[type[BackendError], str]] = {
    nvml_codes.INSUFFICIENT_RESOURCES: (
        InsufficientResourcesError,
        "the placement overlaps an existing GPU instance or the profile is at its maximum count",
    ),
    nvml_codes.IN_USE: (
        InUseError,
        "the instance still has processes, or was released a moment ago; retry shortly",
    ),
    nvml_codes.NOT_SUPPORTED: (
        BackendError,
        "not supported on this GPU (is MIG mode enabled, and does this GPU have this profile?)",
    ),
    nvml_codes.NO_PERMISSION: (
        PermissionDeniedError,
        "insufficient permissions: MIG reconfiguration needs root (or CAP_SYS_ADMIN on the MIG config caps)",
    ),
    nvml_codes.INVALID_ARGUMENT: (
        BackendError,
        "invalid argument: the profile id or placement is not valid for this GPU, or the handle is stale",
    ),
    nvml_codes.NOT_FOUND: (BackendError, "not found: the instance no longer exists"),
    nvml_codes.UNINITIALIZED: (BackendUnavailableError, "NVML is not initialised"),
    nvml_codes.DRIVER_NOT_LOADED: (
        BackendUnavailableError,
        "the NVIDIA driver is not loaded on this node (check `nvidia-smi`)",
    ),
    nvml_codes.LIBRARY_NOT_FOUND: (
        BackendUnavailableError,
        "libnvidia-ml.so was not found: install the NVIDIA driver or run on a GPU node",
    ),
    nvml_codes.LIB_RM_VERSION_MISMATCH: (
        BackendUnavailableError,
        "the NVML library and the kernel driver versions differ: reboot or reload the driver",
    ),
    nvml_codes.GPU_IS_LOST: (
        BackendError,
        "the GPU has fallen off the bus: drain the node and reset it",
    ),
    nvml_codes.RESET_REQUIRED: (
        BackendError,
        "the GPU needs a reset (`sudo nvidia-smi -i N -r` with no processes on it) or a reboot",
    ),
    nvml_codes.TIMEOUT: (BackendError, "the driver timed out; retry"),
    nvml_codes.INSUFFICIENT_SIZE: (BackendError, "internal: a result buffer was too small"),
    nvml_codes.MEMORY: (BackendError, "the driver is out of memory"),
    nvml_codes.UNKNOWN: (BackendError, "unknown NVML error"),
}

NOT_MIG_HINT = (
    "migsched never changes MIG mode. To enable it: drain the GPU, run `sudo nvidia-smi -i {index} -mig 1`, "
    "then reset it (`sudo nvidia-smi -i {index} -r`) or reboot the node, and restart the executor."
)


def not_mig_error(index: int, current: int | None, pending: int | None) -> NotMigModeError:
    if current is None:
        state = "does not support MIG"
    elif pending == 1:
        state = "has MIG mode enable pending (it takes effect after a GPU reset or reboot)"
    else:
        state = "is not in MIG mode"
    return NotMigModeError(
        f"GPU {index} {state}; refusing MIG operations. " + NOT_MIG_HINT.format(index=index),
        code=nvml_codes.NOT_SUPPORTED,
    )


def error_for_code(code: int, action: str) -> BackendError:
    """The typed error for NVML return ``code`` met while doing ``action`` ("create 3g.20gb@4 on GPU 0")."""
    cls, meaning = _TABLE.get(code, (BackendError, "unexpected NVML error"))
    name = _code_name(code)
    return cls(f"{action} failed: {meaning} (NVML error {code} {name})", code=code)


def translate(exc: Exception, action: str) -> BackendError:
    """An ``pynvml.NVMLError`` (its ``value`` is the return code) as the typed error."""
    return error_for_code(int(getattr(exc, "value", nvml_codes.UNKNOWN)), action)


def _code_name(code: int) -> str:
    return nvml_codes.NAMES.get(code, "NVML_ERROR_?")
