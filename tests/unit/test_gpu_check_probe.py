"""``migsched gpu-check --probe``: a process bound as the executor binds a workload must see its device alone."""

from __future__ import annotations

import ctypes.util
import json
import sys

import pytest
from click.testing import CliRunner

from migsched import cudaprobe, gpucheck
from migsched.commands import gpu_check
from services.executor.nvml_fake import FakeGpu, FakeNvml

pytestmark = pytest.mark.unit

# A stand-in for CUDA that honours CUDA_VISIBLE_DEVICES: it shows the process the one device named there.
HONEST_CUDA = (
    "import json, os; v = os.environ['CUDA_VISIBLE_DEVICES']; "
    "print(json.dumps({'visible': v, 'count': 1, 'uuids': [v.split('-', 1)[1]]}))"
)
# One that ignores it and shows every device of the node.
LEAKY_CUDA = (
    "import json; print(json.dumps({'count': 2, 'uuids': ['00000000-0000-0000-0000-000000000001', "
    "'00000000-0000-0000-0000-000000000002']}))"
)


def invoke(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, cuda: str | None, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(gpucheck, "_load_nvml", lambda _spec: fake)
    if cuda is not None:
        monkeypatch.setattr(cudaprobe, "PROBE_ARGV", (sys.executable, "-c", cuda))
    result = CliRunner().invoke(gpu_check.command, ["--probe", *args])
    return result.exit_code, result.output


def test_the_probe_binds_a_whole_gpu_and_each_existing_mig_instance_by_its_own_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mig = FakeGpu("A100-40GB", instances=(("3g.20gb", 4), ("1g.5gb", 0)))
    fake = FakeNvml([mig, FakeGpu("H100-80GB", mig_current=0)])
    code, out = invoke(monkeypatch, fake, HONEST_CUDA, "--json")
    assert code == 0, out
    mig_gpu, whole_gpu = json.loads(out)["gpus"]
    assert [p["bound_to"] for p in mig_gpu["probe"]] == [i["uuid"] for i in mig_gpu["instances"]]
    assert all(p["bound_to"].startswith("MIG-") and p["ok"] for p in mig_gpu["probe"])
    assert [(p["bound_to"], p["ok"]) for p in whole_gpu["probe"]] == [(whole_gpu["uuid"], True)]
    assert whole_gpu["builtin_model"] == "H100-80GB"


def test_a_process_that_sees_other_devices_fails_the_probe_and_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = invoke(monkeypatch, FakeNvml([FakeGpu("H100-80GB", mig_current=0)]), LEAKY_CUDA)
    assert code == 1
    assert "FAILED: CUDA shows the process 2 device(s)" in out
    assert "built-in model: H100-80GB" in out


def test_a_probe_that_prints_no_answer_fails_with_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = invoke(monkeypatch, FakeNvml([FakeGpu("H100-80GB", mig_current=0)]), "raise SystemExit('no cuda')")
    assert code == 1
    assert "the probe exited 1: no cuda" in out


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is present")
def test_without_a_cuda_driver_the_real_probe_says_it_cannot_load_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    code, out = invoke(monkeypatch, FakeNvml([FakeGpu("H100-80GB", mig_current=0)]), None)
    assert code == 1
    assert "FAILED: the CUDA driver library cannot be loaded" in out
    assert "LD_LIBRARY_PATH" not in out


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is present")
def test_a_library_path_workloads_would_not_get_is_named_as_the_likely_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    code, out = invoke(monkeypatch, FakeNvml([FakeGpu("H100-80GB", mig_current=0)]), None)
    assert code == 1
    assert "add it to MIGSCHED_EXECUTOR_ENV_ALLOWLIST" in out
    monkeypatch.setenv("MIGSCHED_EXECUTOR_ENV_ALLOWLIST", "PATH,LD_LIBRARY_PATH")
    code, out = invoke(monkeypatch, FakeNvml([FakeGpu("H100-80GB", mig_current=0)]), None)
    assert code == 1 and "MIGSCHED_EXECUTOR_ENV_ALLOWLIST" not in out  # passed on: the hint would mislead


def test_cuda_uuid_bytes_read_as_the_hex_of_nvml_gpu_and_mig_names() -> None:
    raw = bytes(range(16))
    hex_form = cudaprobe.format_uuid(raw)
    assert hex_form == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert cudaprobe.same_device("GPU-00010203-0405-0607-0809-0A0B0C0D0E0F", hex_form)
    assert cudaprobe.same_device("MIG-" + hex_form, hex_form)
    assert not cudaprobe.same_device("GPU-" + hex_form[:-1] + "0", hex_form)
