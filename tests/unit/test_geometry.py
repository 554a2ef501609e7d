"""Geometry as data: validation of tables, user overrides, and look-ups by name, alias and PCI id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.errors import GeometryError, UnknownModelError
from shared.mig.geometry import default_geometry, load_geometry

pytestmark = pytest.mark.unit

MODELS = ("A30-24GB", "A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H100-96GB", "H200-141GB",
          "GH200-144GB", "B200-180GB")


def _profile(**over: Any) -> dict[str, Any]:
    p = {"name": "1g.10gb", "shape": "1g", "nvml_enum": 0, "profile_id": 19, "compute_slices": 1,
         "memory_slices": 1, "placements": [0, 1, 2, 3], "max_count": 4, "memory_gib": 10.0, "sm_count": 16}
    p.update(over)
    return p


def _model(profiles: list[dict[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
    m = {"name": "X1-40GB", "aliases": ["NVIDIA X1"], "pci_device_ids": ["0x9999"], "memory_slices": 4,
         "compute_slices": 4, "memory_gib": 40, "sm_count": 64,
         "profiles": profiles if profiles is not None else [_profile()]}
    m.update(over)
    return m


def _write(tmp_path: Path, *models: dict[str, Any]) -> Path:
    path = tmp_path / "geometry.json"
    path.write_text(json.dumps({"schema": 1, "models": list(models)}))
    return path


def test_every_model_the_issue_names_is_built_in() -> None:
    names = {m.name for m in default_geometry().models}
    assert set(MODELS) <= names


def test_an_override_file_adds_a_new_gpu_model_without_code_change(tmp_path: Path) -> None:
    geo = load_geometry(_write(tmp_path, _model()))
    model = geo.model("X1-40GB")
    assert model.profile("1g.10gb").placements == (0, 1, 2, 3)
    assert geo.model("A100-40GB").memory_slices == 8  # built-ins are kept


def test_an_override_replaces_a_built_in_model_of_the_same_name(tmp_path: Path) -> None:
    geo = load_geometry(_write(tmp_path, _model(name="A30-24GB", aliases=[], pci_device_ids=[])))
    assert [p.name for p in geo.model("A30-24GB").profiles] == ["1g.10gb"]


def test_an_override_may_be_toml(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        'schema = 1\n[[models]]\nname = "T-8"\nmemory_slices = 2\ncompute_slices = 2\nmemory_gib = 8\n'
        'sm_count = 8\n[[models.profiles]]\nname = "1g.4gb"\nshape = "1g"\nnvml_enum = 0\nprofile_id = 1\n'
        'compute_slices = 1\nmemory_slices = 1\nplacements = [0, 1]\nmax_count = 2\nmemory_gib = 4\n'
        'sm_count = 4\n'
    )
    assert load_geometry(path).model("T-8").profile("1g.4gb").max_count == 2


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (_model([_profile(placements=[0, 3], memory_slices=2)]), "ends past memory slice"),
        (_model([_profile(), _profile(profile_id=20)]), "duplicate profile name"),
        (_model([_profile(), _profile(name="other")]), "duplicate NVML profile id"),
        (_model([_profile(memory_slices=5)]), "larger than the GPU"),
        (_model([_profile(placements=[])]), "no placements"),
        (_model([_profile(placements=[1, 1])]), "repeated placement start"),
        (_model([_profile(memory_gib=99.0)]), "exceeds the GPU's 40"),
        (_model([_profile(sm_count=999)]), "SMs exceeds"),
        (_model(compute_slices=8, memory_slices=4), "more compute slices"),
        (_model([]), "no profiles"),
        (_model(pci_device_ids=["zz"]), "is not hexadecimal"),
    ],
)
def test_a_malformed_table_is_refused_with_a_specific_error(
    tmp_path: Path, model: dict[str, Any], message: str
) -> None:
    with pytest.raises(GeometryError, match=message):
        load_geometry(_write(tmp_path, model))


def test_a_field_of_the_wrong_type_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(GeometryError, match="memory_slices"):
        load_geometry(_write(tmp_path, _model(memory_slices="eight")))


def test_a_missing_file_is_a_geometry_error(tmp_path: Path) -> None:
    with pytest.raises(GeometryError, match="cannot read geometry file"):
        load_geometry(tmp_path / "absent.json")


def test_a_model_is_found_by_name_alias_or_nvml_style_name() -> None:
    geo = default_geometry()
    assert geo.model("A100-40GB") is geo.model("NVIDIA A100-SXM4-40GB")
    assert geo.model("nvidia a100-sxm4-40gb").name == "A100-40GB"
    assert geo.model("NVIDIA H200").name == "H200-141GB"


def test_a_model_is_found_by_pci_device_id_in_every_spelling() -> None:
    geo = default_geometry()
    for dev in ("0x20B0", "20b0", 0x20B0, "0x20B010DE", 0x20B010DE):
        assert geo.by_pci_device_id(dev).name == "A100-40GB"


def test_an_unknown_model_or_pci_id_lists_what_is_known() -> None:
    geo = default_geometry()
    with pytest.raises(UnknownModelError, match=r"known models: .*A100-40GB"):
        geo.model("V100")
    with pytest.raises(UnknownModelError, match="0x1234"):
        geo.by_pci_device_id("0x1234")


def test_h100_and_h200_sm_counts_are_not_proportional_to_slices() -> None:
    h100 = default_geometry().model("H100-80GB")
    assert h100.profile("1g.20gb").sm_count == 26 and h100.profile("1g.10gb").sm_count == 16
    assert h100.profile("3g.40gb").sm_count == 60 and h100.profile("4g.40gb").sm_count == 64


def test_profile_ids_and_enums_match_nvml_for_the_a100() -> None:
    a100 = default_geometry().model("A100-40GB")
    ids = {p.shape: (p.profile_id, p.nvml_enum) for p in a100.profiles}
    assert ids == {"1g": (19, 0), "1g+me": (20, 7), "1g.2x": (15, 9), "2g": (14, 1), "3g": (9, 2),
                   "4g": (5, 3), "7g": (0, 4)}
