"""``migsched geometry``: listing, one model's table, --check with its exit status, --json, overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from migsched.cli import main

pytestmark = pytest.mark.unit


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["geometry", *args])
    return result.exit_code, result.stdout, result.stderr


def test_geometry_lists_every_known_model() -> None:
    code, out, _ = _run()
    assert code == 0
    for name in ("A30-24GB", "A100-40GB", "H100-80GB", "H200-141GB", "B200-180GB"):
        assert name in out


def test_geometry_lists_models_as_json() -> None:
    code, out, _ = _run("--json")
    assert code == 0
    models = {m["name"]: m for m in json.loads(out)}
    assert models["A30-24GB"]["memory_slices"] == 4 and "1g.6gb" in models["A30-24GB"]["profiles"]


def test_geometry_model_shows_profiles_ids_placements_and_max_counts() -> None:
    code, out, _ = _run("NVIDIA A100-SXM4-40GB")
    assert code == 0
    assert "3g.20gb" in out and "{0,4}:4" in out and "{0,1,2,3,4,5,6}:1" in out


def test_geometry_model_as_json_carries_every_field() -> None:
    code, out, _ = _run("H100-80GB", "--json")
    assert code == 0
    data = json.loads(out)
    p = next(p for p in data["profiles"] if p["name"] == "1g.20gb")
    assert (p["profile_id"], p["nvml_enum"], p["placements"], p["max_count"], p["sm_count"]) == (
        15, 9, [0, 2, 4, 6], 4, 26)


def test_check_says_a_mix_fits_and_draws_a_layout() -> None:
    code, out, _ = _run("A100-40GB", "--check", "1g.5gb:2,2g.10gb,3g.20gb")
    assert code == 0
    assert "fits one A100-40GB" in out and "[" in out and "3g.20gb@4:4" in out


def test_check_exits_1_when_the_mix_does_not_fit() -> None:
    code, out, _ = _run("A100-40GB", "--check", "3g.20gb:2,1g.5gb")
    assert code == 1 and "does not fit" in out


def test_check_as_json_gives_the_layout() -> None:
    code, out, _ = _run("A30-24GB", "--check", "1g:2,2g", "--json")
    data = json.loads(out)
    assert code == 0 and data["fits"] is True
    assert sorted((x["profile"], x["start"]) for x in data["layout"]) == [
        ("1g.6gb", 2), ("1g.6gb", 3), ("2g.12gb", 0)]
    code, out, _ = _run("A30-24GB", "--check", "4g,1g", "--json")
    assert code == 1 and json.loads(out)["fits"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("V100",), "unknown GPU model 'V100'"),
        (("A100-40GB", "--check", "9g.99gb"), "has no profile '9g.99gb'"),
        (("A100-40GB", "--check", "1g.5gb:two"), "not a whole number"),
        (("A100-40GB", "--check", "1g.5gb:0"), "at least 1"),
        (("A100-40GB", "--check", "1g.5gb,,2g.10gb"), "empty item"),
        (("--check", "1g.5gb"), "needs a MODEL"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(args: tuple[str, ...], message: str) -> None:
    code, _, err = _run(*args)
    assert code == 2 and message in err


def test_a_geometry_file_adds_a_model(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"models": [{
        "name": "Z9-16GB", "memory_slices": 2, "compute_slices": 2, "memory_gib": 16, "sm_count": 8,
        "profiles": [{"name": "1g.8gb", "shape": "1g", "nvml_enum": 0, "profile_id": 1, "compute_slices": 1,
                      "memory_slices": 1, "placements": [0, 1], "max_count": 2, "memory_gib": 8,
                      "sm_count": 4}]}]}))
    code, out, _ = _run("Z9-16GB", "--check", "1g.8gb:2", "--geometry-file", str(path))
    assert code == 0 and "fits" in out
    code, _, err = _run("--geometry-file", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read geometry file" in err
