"""What CUDA shows a process: run as ``python -m migsched.cudaprobe``, it prints one JSON line.

``migsched gpu-check --probe`` starts it with the environment the executor gives a workload bound to a GPU or a
MIG instance (``CUDA_VISIBLE_DEVICES`` set to its UUID) and checks that the process sees that one device and no
other. It talks to the CUDA driver library through ``ctypes`` so that it needs no framework; it creates no
context and allocates nothing, so it changes nothing on the GPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from services.executor.process import build_env

_LIBRARIES = ("libcuda.so.1", "libcuda.so")


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


def format_uuid(raw: bytes) -> str:
    """The 16 bytes CUDA returns, in the 8-4-4-4-12 hex form NVML's UUIDs carry after their ``GPU-``/``MIG-``."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def same_device(nvml_uuid: str, cuda_uuid: str) -> bool:
    """NVML names a device ``GPU-<hex>`` or ``MIG-<hex>``; CUDA gives the bare hex of the same 16 bytes."""
    return nvml_uuid.split("-", 1)[-1].lower() == cuda_uuid.lower()


def _load() -> Any:
    errors = []
    for name in _LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError("; ".join(errors))


def probe() -> dict[str, Any]:
    """The devices CUDA enumerates in this process, by UUID, or the reason it could not ask."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        cuda = _load()
    except OSError as exc:
        return {"visible": visible, "error": f"the CUDA driver library cannot be loaded ({exc})"}
    code = cuda.cuInit(0)
    if code != 0:
        # 100 (CUDA_ERROR_NO_DEVICE) is what a UUID that names no device gives: an answer, not a fault.
        return {"visible": visible, "count": 0, "uuids": [], "init_error": int(code)}
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return {"visible": visible, "error": "cuDeviceGetCount failed"}
    # The _v2 call gives a MIG device's own UUID; the first one gives its parent GPU's.
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
    uuids = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        uuid = _Uuid()
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or get_uuid(ctypes.byref(uuid), device) != 0:
            return {"visible": visible, "error": f"cannot read the UUID of CUDA device {ordinal}"}
        uuids.append(format_uuid(bytes(uuid.bytes)))
    return {"visible": visible, "count": count.value, "uuids": uuids}


PROBE_ARGV = (sys.executable, "-m", "migsched.cudaprobe")


def bound_probe(uuid: str, allowlist: Sequence[str], *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Start the probe bound to ``uuid`` exactly as the executor binds a workload (the environment it passes on
    is ``allowlist``'s), and judge what it saw.

    ``ok`` is true when CUDA showed the process that one device and nothing else; ``reason`` says what it saw
    otherwise."""
    env, _ = build_env({}, allowlist=allowlist, mig_uuid=uuid, job_id="gpu-check-probe")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the child imports this very package
    try:
        done = subprocess.run(
            list(PROBE_ARGV), env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"bound_to": uuid, "ok": False, "reason": f"the probe did not answer within {timeout_s:g} s"}
    try:
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr or done.stdout).strip()[-300:]
        return {"bound_to": uuid, "ok": False, "reason": f"the probe exited {done.returncode}: {tail}"}
    return {"bound_to": uuid, **seen, **_judge(uuid, seen, env)}


def _judge(uuid: str, seen: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    if "error" in seen:
        return {"ok": False, "reason": seen["error"] + _library_hint(env)}
    uuids = seen.get("uuids", [])
    if len(uuids) == 1 and same_device(uuid, uuids[0]):
        return {"ok": True, "reason": "CUDA shows the process this device only"}
    if not uuids:
        return {"ok": False, "reason": f"CUDA shows the process no device (cuInit {seen.get('init_error')})"}
    return {"ok": False, "reason": f"CUDA shows the process {len(uuids)} device(s): {', '.join(uuids)}"}


def _library_hint(env: dict[str, str]) -> str:
    """Where this process finds the driver through LD_LIBRARY_PATH, a workload without it will not."""
    if os.environ.get("LD_LIBRARY_PATH") and "LD_LIBRARY_PATH" not in env:
        return (
            "; this shell has LD_LIBRARY_PATH but workloads do not get it: add it to "
            "MIGSCHED_EXECUTOR_ENV_ALLOWLIST, or register the driver's libraries with ldconfig"
        )
    return ""


def main() -> None:
    sys.stdout.write(json.dumps(probe()) + "\n")


if __name__ == "__main__":
    main()
