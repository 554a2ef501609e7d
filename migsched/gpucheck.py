"""What NVML says about this node's GPUs, compared with the built-in MIG tables.

Read-only by default: MIG mode (current/pending), the profile table and placements read from NVML, the
instances that exist, and every difference from the built-in table. ``--measure`` (explicit) times GI/CI
create and destroy per profile on a free MIG-enabled GPU and leaves it as it found it; ``--probe`` starts a
process bound to each GPU or MIG instance as the executor binds a workload (``migsched.cudaprobe``). It never
changes MIG mode and never resets a GPU. Exit codes: 0 fine, 1 a measurement or a probe was refused or failed,
2 no NVML/driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from typing import Any

import click
import msgspec
import pynvml

from migsched import cudaprobe
from services.executor import nvml_ops
from services.executor.config import ExecutorSettings, env_allowlist
from services.executor.nvml_discovery import NvmlGpu, build_model, compare, match_builtin, read_gpu, read_profiles
from services.executor.nvml_errors import translate
from shared.mig.geometry import GpuModel, Profile, default_geometry
from shared.settings import load

FAKE_ENV = "MIGSCHED_NVML_FAKE"


def _load_nvml(fake: str | None) -> Any:
    spec = fake or os.environ.get(FAKE_ENV)
    if spec:
        from services.executor.nvml_fake import from_spec

        return from_spec(spec)
    return pynvml


def _mode(value: int | None) -> str:
    return {None: "not supported", 0: "disabled", 1: "enabled"}.get(value, str(value))


def _offered_when_off(nvml: Any, raw: NvmlGpu) -> NvmlGpu:
    """A GPU that supports MIG but has it off: the table the driver offers once it is on, where the driver
    answers (reading it changes nothing), so that a table is checked before anyone turns MIG on."""
    if raw.mig_current != 0:
        return raw
    try:
        profiles = read_profiles(nvml, nvml.nvmlDeviceGetHandleByIndex(raw.index))
    except pynvml.NVMLError:
        return raw
    return msgspec.structs.replace(raw, profiles=profiles)


def _inspect(nvml: Any, index: int) -> dict[str, Any]:
    raw: NvmlGpu = _offered_when_off(nvml, read_gpu(nvml, index))
    builtin = match_builtin(raw, default_geometry())
    out: dict[str, Any] = msgspec.to_builtins(raw)
    out["builtin_model"] = builtin.name if builtin else None
    out["differences"] = compare(raw, builtin) if raw.profiles else []
    out["instances"] = []
    if raw.mig_current == 1:
        model = build_model(raw, builtin)
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for inst in nvml_ops.list_instances(nvml, handle, model):
            entry = msgspec.to_builtins(inst)
            entry["profile"] = next((p.name for p in model.profiles if p.profile_id == inst.profile_id), "?")
            out["instances"].append(entry)
    return out


def _print_gpu(info: dict[str, Any]) -> None:
    click.echo(f"GPU {info['index']}: {info['name']}  PCI {info['pci_device_id']}  {info['uuid']}")
    click.echo(f"  MIG mode: current {_mode(info['mig_current'])}, pending {_mode(info['mig_pending'])}")
    if info["mig_current"] != 1:
        click.echo(f"  built-in model: {info['builtin_model'] or 'none (runs as a plain GPU of its NVML name)'}")
        if info["mig_current"] is not None:
            click.echo(
                f"  not in MIG mode: migsched will not use it for MIG. To enable (changes the GPU): "
                f"sudo nvidia-smi -i {info['index']} -mig 1, then reset or reboot."
            )
        if not info["profiles"]:
            return
        click.echo("  the MIG table the driver offers once MIG is on:")
    else:
        click.echo(f"  built-in table: {info['builtin_model'] or 'none (NVML table used as is)'}")
    _print_table(info)


def _print_table(info: dict[str, Any]) -> None:
    click.echo(
        "  profile (from NVML)     ID  enum  c/m slices  max  memory MiB  SMs  placements (start:size)"
    )
    for p in info["profiles"]:
        sizes = {n for _, n in p["placements"]}
        starts = ",".join(str(s) for s, _ in p["placements"])
        click.echo(
            f"  {p['name'] or '(unnamed)':<22} {p['profile_id']:>3} {p['enum']:>5}  {p['compute_slices']:>4}/"
            f"{'/'.join(map(str, sorted(sizes))):<5} {p['instance_count']:>4} {p['memory_mb']:>11}"
            f" {p['sm_count']:>4}  {{{starts}}}:{'/'.join(map(str, sorted(sizes)))}"
        )
    if info["mig_current"] == 1:
        insts = ", ".join(f"{i['profile']}@{i['start']} (GI {i['gi_id']})" for i in info["instances"]) or "none"
        click.echo(f"  instances now: {insts}")
    if info["differences"]:
        click.echo("  DIFFERENCES from the built-in table (NVML wins on this node):")
        for line in info["differences"]:
            click.echo(f"    - {line}")
    else:
        click.echo("  differences from the built-in table: none")


def _destroy_retry(nvml: Any, handle: Any, gi_id: int, window_s: float = 5.0) -> None:
    deadline = time.monotonic() + window_s
    while True:
        try:
            nvml_ops.destroy(nvml, handle, gi_id)
            return
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_IN_USE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _time_profile(nvml: Any, handle: Any, profile: Profile, repeat: int) -> dict[str, float]:
    """Median milliseconds of GI create, CI create, CI destroy, GI destroy at the profile's last placement."""
    samples: dict[str, list[float]] = {"gi_create": [], "ci_create": [], "ci_destroy": [], "gi_destroy": []}
    for _ in range(repeat):
        placement = pynvml.c_nvmlGpuInstancePlacement_t(profile.placements[-1], profile.memory_slices)
        gi_id = None
        try:
            t0 = time.perf_counter()
            gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                handle, profile.profile_id, ctypes.byref(placement)
            )
            t1 = time.perf_counter()
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_profile = nvml_ops.full_ci_profile(nvml, gi)
            t2 = time.perf_counter()
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
            t3 = time.perf_counter()
            nvml.nvmlComputeInstanceDestroy(ci)
            t4 = time.perf_counter()
            _destroy_retry(nvml, handle, gi_id)
            t5 = time.perf_counter()
            gi_id = None
        finally:
            if gi_id is not None:  # leave the GPU as we found it, whatever failed
                _destroy_retry(nvml, handle, gi_id)
        samples["gi_create"].append(t1 - t0)
        samples["ci_create"].append(t3 - t2)
        samples["ci_destroy"].append(t4 - t3)
        samples["gi_destroy"].append(t5 - t4)
    return {k: round(statistics.median(v) * 1000, 2) for k, v in samples.items()}


def _measure(nvml: Any, index: int, repeat: int) -> dict[str, Any]:
    """Time GI create, CI create, CI destroy, GI destroy per profile. Refuses a GPU that has any instance."""
    raw = read_gpu(nvml, index)
    if raw.mig_current != 1:
        raise click.ClickException(f"GPU {index} is not in MIG mode; --measure needs a MIG-enabled GPU")
    model: GpuModel = build_model(raw, match_builtin(raw, default_geometry()))
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    existing = nvml_ops.list_instances(nvml, handle, model)
    if existing:
        raise click.ClickException(
            f"GPU {index} has {len(existing)} MIG instance(s) this command did not create; "
            "--measure needs a free GPU and never touches existing instances"
        )
    results: dict[str, Any] = {}
    for profile in model.profiles:
        try:
            results[profile.name] = _time_profile(nvml, handle, profile, repeat)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NO_PERMISSION:
                raise  # every profile would fail the same way: say it once
            results[profile.name] = {"failed": str(translate(exc, f"create/destroy {profile.name}"))}
    if nvml_ops.list_instances(nvml, handle, model):
        raise click.ClickException(
            f"GPU {index} still has instances after measuring: check with nvidia-smi mig -lgi"
        )
    return {"unit": "ms (median)", "repeat": repeat, "profiles": results}


def _probe_targets(info: dict[str, Any]) -> list[str]:
    """What a workload is bound to on this GPU: the whole GPU, or each MIG instance that exists now."""
    if info["mig_current"] == 1:
        return [i["uuid"] for i in info["instances"] if i.get("uuid")]
    return [info["uuid"]]


def run(
    as_json: bool, gpus: tuple[int, ...], measure: bool, repeat: int, fake: str | None, probe: bool = False
) -> None:
    """``migsched gpu-check`` (``migsched.commands.gpu_check`` holds its options); exits with its code."""
    nvml = _load_nvml(fake)
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        click.echo(f"gpu-check: NVML is not available: {translate(exc, 'initialise NVML')}", err=True)
        sys.exit(2)
    except OSError as exc:  # pragma: no cover - a broken library install
        click.echo(f"gpu-check: cannot load NVML: {exc}", err=True)
        sys.exit(2)
    code = 0
    try:
        driver = nvml.nvmlSystemGetDriverVersion()
        indices = list(gpus) or list(range(nvml.nvmlDeviceGetCount()))
        report: dict[str, Any] = {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "gpus": [],
        }
        for index in indices:
            info = _inspect(nvml, index)
            if probe:
                allowed = env_allowlist(load(ExecutorSettings))
                info["probe"] = [cudaprobe.bound_probe(uuid, allowed) for uuid in _probe_targets(info)]
                code = code or int(not all(p["ok"] for p in info["probe"]))
            if measure:
                try:
                    info["measure"] = _measure(nvml, index, repeat)
                except click.ClickException as exc:
                    info["measure"] = {"refused": exc.message}
                    code = 1
                except pynvml.NVMLError as exc:
                    info["measure"] = {"failed": str(translate(exc, f"measure GPU {index}"))}
                    code = 1
            report["gpus"].append(info)
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            click.echo(
                f"NVIDIA driver {report['driver']}; {len(report['gpus'])} GPU(s) checked (read-only"
                f"{'' if not measure else ', plus --measure'}{'' if not probe else ', plus --probe'})"
            )
            for info in report["gpus"]:
                _print_gpu(info)
                for p in info.get("probe", []):
                    click.echo(f"  probe bound to {p['bound_to']}: {'ok' if p['ok'] else 'FAILED'}: {p['reason']}")
                if "measure" in info:
                    click.echo(f"  measure: {json.dumps(info['measure'])}")
    except pynvml.NVMLError as exc:
        click.echo(f"gpu-check: {translate(exc, 'read the GPUs')}", err=True)
        code = 1
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            nvml.nvmlShutdown()
    sys.exit(code)
