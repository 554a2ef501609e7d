"""Oracles from reference/mig-geometry.md: layout counts, NVIDIA's default layouts, the FragCost table."""

from __future__ import annotations

from collections import Counter

import pytest

from shared.mig.geometry import default_geometry
from shared.mig.occupancy import enumerate_layouts, fit_mix, layout_mask, maximal_layouts
from shared.mig.tables import tables_for
from shared.policy.fragcost import frag_cost
from shared.policy.static_layouts import static_layout

pytestmark = pytest.mark.unit

GEO = default_geometry()
A100 = GEO.model("A100-40GB")


def _multisets(layouts: list[tuple[tuple[str, int], ...]]) -> set[tuple[tuple[str, int], ...]]:
    return {tuple(sorted(Counter(name for name, _ in lay).items())) for lay in layouts}


def test_the_a100_without_double_memory_1g_has_19_maximal_layouts_forming_14_multisets() -> None:
    profiles = [p for p in A100.scoring_profiles() if p.shape != "1g.2x"]
    maximal = maximal_layouts(A100, profiles)
    assert len(maximal) == 19
    assert len(_multisets(maximal)) == 14


def test_the_fourteen_multisets_are_the_documented_ones() -> None:
    profiles = [p for p in A100.scoring_profiles() if p.shape != "1g.2x"]
    short = {"1g.5gb": "1g", "2g.10gb": "2g", "3g.20gb": "3g", "4g.20gb": "4g", "7g.40gb": "7g"}
    got = {
        "+".join(f"{n}x{short[name]}" if n > 1 else short[name] for name, n in sorted(ms, key=lambda x: x[0]))
        for ms in _multisets(maximal_layouts(A100, profiles))
    }
    documented = ["7g", "4g+3g", "2x3g", "2x2g+3g", "4g+2g+1g", "3g+2g+1g", "3x2g+1g", "4g+3x1g", "3g+3x1g",
                  "3g+4x1g", "2x2g+3x1g", "3g+2g+2x1g", "2g+5x1g", "7x1g"]

    def canon(text: str) -> str:
        parts = []
        for part in text.split("+"):
            n, _, shape = part.rpartition("x")
            parts.append((shape, int(n) if n else 1))
        return "+".join(f"{n}x{s}" if n > 1 else s for s, n in sorted(parts))

    assert {canon(g) for g in got} == {canon(d) for d in documented}


def test_the_a100_with_double_memory_1g_has_722_layouts_and_78_maximal() -> None:
    profiles = list(A100.scoring_profiles())
    assert len(profiles) == 6
    assert sum(1 for _ in enumerate_layouts(A100, profiles)) == 722
    assert len(maximal_layouts(A100, profiles)) == 78


def test_the_a30_has_25_layouts_and_5_maximal() -> None:
    a30 = GEO.model("A30-24GB")
    profiles = list(a30.scoring_profiles())
    assert sum(1 for _ in enumerate_layouts(a30, profiles)) == 25
    maximal = maximal_layouts(a30, profiles)
    assert len(maximal) == 5
    assert _multisets(maximal) == {
        (("1g.6gb", 4),), (("1g.6gb", 2), ("2g.12gb", 1)), (("2g.12gb", 2),), (("4g.24gb", 1),),
    }
    # 2x1g + 2g exists twice at placement level: the 2g at slice 0 or at slice 2
    assert sum(1 for lay in maximal if ("2g.12gb", 0) in lay or ("2g.12gb", 2) in lay) == 3


@pytest.mark.parametrize("model", [m.name for m in GEO.models])
def test_every_all_profile_and_all_balanced_layout_of_mig_parted_fits_its_model(model: str) -> None:
    m = GEO.model(model)
    names = ["all-balanced"] + [f"all-{p.name}" for p in m.profiles]
    for name in names:
        layout = static_layout(m, name)
        assert layout, name
        layout_mask(m, layout)  # raises on overlap or an illegal start


@pytest.mark.parametrize(
    ("model", "mix"),
    [
        ("A100-40GB", {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        ("A100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        ("H100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        ("H200-141GB", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        ("A30-24GB", {"1g.6gb": 2, "2g.12gb": 1}),
        ("A100-40GB", {"1g.10gb": 4}),
        ("H100-80GB", {"1g.10gb": 7}),
        ("A100-40GB", {"7g.40gb": 1}),
        ("B200-180GB", {"3g.90gb": 2}),
    ],
)
def test_documented_mig_parted_configurations_are_feasible(model: str, mix: dict[str, int]) -> None:
    m = GEO.model(model)
    layout = fit_mix(m, mix)
    assert layout is not None
    assert Counter(name for name, _ in layout) == mix
    layout_mask(m, layout)


def test_all_balanced_has_the_documented_instances() -> None:
    assert Counter(n for n, _ in static_layout(A100)) == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert Counter(n for n, _ in static_layout(GEO.model("H200-141GB"))) == {
        "1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert Counter(n for n, _ in static_layout(GEO.model("A30-24GB"))) == {"1g.6gb": 2, "2g.12gb": 1}
    assert len(static_layout(A100, "all-1g.10gb")) == 4
    assert len(static_layout(GEO.model("H100-80GB"), "all-1g.10gb")) == 7


def test_more_instances_than_fit_are_refused() -> None:
    assert fit_mix(A100, {"3g.20gb": 3}) is None
    assert fit_mix(A100, {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}) is None
    assert fit_mix(GEO.model("A30-24GB"), {"2g.12gb": 1, "1g.6gb": 3}) is None


def _mask(*spans: tuple[int, int]) -> int:
    m = 0
    for start, size in spans:
        m |= ((1 << size) - 1) << start
    return m


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (_mask((6, 1)), 0.315),
        (_mask((0, 1)), 0.538),
        (_mask((3, 1)), 0.538),
        (_mask((4, 2)), 0.395),
        (_mask((0, 2)), 0.562),
        (_mask((4, 4)), 0.460),
        (_mask((0, 4)), 0.706),
        (_mask((5, 1), (6, 1)), 0.437),
        (_mask((0, 1), (6, 1)), 0.687),
        (_mask((4, 4), (0, 2)), 0.855),
        (0xFF, 1.000),
        (0, 0.0),
    ],
)
def test_fragcost_matches_the_reference_table_to_three_decimals(mask: int, expected: float) -> None:
    assert frag_cost(A100, mask) == pytest.approx(expected, abs=5e-4)


def test_fragcost_averages_over_six_profiles_without_media_extensions() -> None:
    t = tables_for(A100)
    assert [A100.profiles[i].name for i in t.scoring_idx] == [
        "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert list(t.feasible[0, t.scoring_idx]) == [7, 4, 3, 2, 1, 1]
