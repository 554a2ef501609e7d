"""NVML return codes (``nvmlReturn_t`` in nvml.h): the executor's error vocabulary for every backend.

Kept here rather than read from pynvml so that the executor with the simulated backend, and every other
service, runs without the ``[nvml]`` extra. The values are the C API's and do not change between driver
releases; a unit test checks them against pynvml where it is installed.
"""

from __future__ import annotations

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
MEMORY = 20
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999

NAMES: dict[int, str] = {
    v: f"NVML_ERROR_{k}" for k, v in dict(globals()).items() if k.isupper() and isinstance(v, int) and k != "SUCCESS"
}
"""Code -> its nvml.h name (``NVML_ERROR_IN_USE``)."""
