"""``migsched gpu-check``: read-only report, JSON, differences, --measure safety, and no-driver exit code."""

from __future__ import annotations

import ctypes.util
import json

import msgspec
import pytest
from click.testing import CliRunner

from migsched import gpucheck
from migsched.commands import gpu_check
from services.executor.nvml_fake import FakeGpu, FakeNvml
from shared.mig.geometry import default_geometry

pytestmark = pytest.mark.unit

MUTATIONS = ("Create", "Destroy")


def invoke(
    *args: str, fake: FakeNvml | None = None, monkeypatch: pytest.MonkeyPatch | None = None
) -> tuple[int, str]:
    if fake is not None and monkeypatch is not None:
        monkeypatch.setattr(gpucheck, "_load_nvml", lambda _spec: fake)
    result = CliRunner().invoke(gpu_check.command, list(args))
    return result.exit_code, result.output


def test_the_report_shows_mig_mode_the_nvml_table_and_no_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB", instances=(("3g.20gb", 4),)), FakeGpu("H100-80GB", mig_current=0)])
    code, out = invoke(fake=fake, monkeypatch=monkeypatch)
    assert code == 0, out
    assert "MIG mode: current enabled, pending enabled" in out
    assert "3g.20gb" in out and "{0,4}:4" in out
    assert "instances now: 3g.20gb@4 (GI 1)" in out
    assert "differences from the built-in table: none" in out
    assert "sudo nvidia-smi -i 1 -mig 1" in out
    assert not any(m in c for c in fake.calls for m in MUTATIONS)  # read-only


def test_json_output_carries_profiles_by_enum_and_id_and_the_differences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a100 = default_geometry().model("A100-40GB")
    table = msgspec.structs.replace(a100, profiles=tuple(p for p in a100.profiles if p.name != "1g.5gb+me"))
    code, out = invoke("--json", fake=FakeNvml([FakeGpu("A100-40GB", table=table)]), monkeypatch=monkeypatch)
    assert code == 0, out
    (gpu,) = json.loads(out)["gpus"]
    one_g = next(p for p in gpu["profiles"] if p["name"] == "1g.5gb")
    assert (one_g["enum"], one_g["profile_id"], one_g["placements"][0]) == (0, 19, [0, 1])
    assert gpu["builtin_model"] == "A100-40GB"
    assert any("1g.5gb+me" in d for d in gpu["differences"])


def test_the_fake_can_be_chosen_from_the_command_line() -> None:
    code, out = invoke("--fake", "A30-24GB,Tesla T4:nomig")
    assert code == 0, out
    assert "NVIDIA A30" in out and "current not supported" in out


def test_without_nvml_it_says_so_and_exits_2() -> None:
    code, out = invoke("--fake", "unavailable")
    assert code == 2
    assert "NVML is not available" in out


def test_measure_times_every_profile_and_leaves_the_gpu_as_it_found_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml([FakeGpu("A30-24GB")])
    code, out = invoke("--measure", "--repeat", "2", "--json", fake=fake, monkeypatch=monkeypatch)
    assert code == 0, out
    measured = json.loads(out)["gpus"][0]["measure"]["profiles"]
    assert set(measured) == {p.name for p in default_geometry().model("A30-24GB").profiles}
    assert set(measured["2g.12gb"]) == {"gi_create", "ci_create", "ci_destroy", "gi_destroy"}
    assert fake.snapshot(0) == []


def test_measure_refuses_a_gpu_with_instances_it_did_not_create(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu("A100-40GB", instances=(("1g.5gb", 6),))])
    code, out = invoke("--measure", fake=fake, monkeypatch=monkeypatch)
    assert code == 1
    assert "did not create" in out
    assert fake.snapshot(0) == [("1g.5gb", 6, 1)]
    assert not any(m in c for c in fake.calls for m in MUTATIONS)


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="NVIDIA driver present")
def test_on_a_machine_without_a_driver_the_real_check_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpucheck.FAKE_ENV, raising=False)
    code, out = invoke()
    assert code == 2
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in out or "NVML_ERROR_DRIVER_NOT_LOADED" in out


def test_a_gpu_with_mig_off_shows_the_table_the_driver_offers_and_its_differences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h200 = default_geometry().model("H200-141GB")
    table = msgspec.structs.replace(h200, profiles=tuple(p for p in h200.profiles if p.name != "1g.35gb"))
    fake = FakeNvml(
        [FakeGpu("H200-141GB", mig_current=0, table=table), FakeGpu(None, name="Tesla T4", mig_current=None)]
    )
    code, out = invoke(fake=fake, monkeypatch=monkeypatch)
    assert code == 0, out
    assert "the MIG table the driver offers once MIG is on:" in out
    assert "3g.71gb                  9     2     3/4        2       71424   60  {0,4}:4" in out
    assert "profile 1g.35gb (ID 15) is in the table but this GPU/driver does not offer it" in out
    assert out.count("the MIG table the driver offers") == 1  # the T4 has no MIG at all
    assert "instances now" not in out
    assert not any(m in c for c in fake.calls for m in MUTATIONS)
