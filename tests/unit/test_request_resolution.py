"""One request, many GPU models: exact names, shapes, sizes, whole GPUs and time-sliced shares."""

from __future__ import annotations

import pytest

from shared.errors import RequestError
from shared.mig.geometry import default_geometry
from shared.policy.request import Demand, full_profile, mig, profile_for_fraction, resolve_profile, sized

pytestmark = pytest.mark.unit

GEO = default_geometry()


def _on(demand: Demand, model: str) -> str | None:
    p = resolve_profile(demand, GEO.model(model))
    return None if p is None else p.name


def test_an_exact_profile_name_resolves_only_on_models_that_have_it() -> None:
    assert _on(mig("3g.20gb"), "A100-40GB") == "3g.20gb"
    assert _on(mig("nvidia.com/mig-3g.20gb"), "A100-40GB") == "3g.20gb"
    assert _on(mig("3g.20gb"), "H200-141GB") is None
    assert _on(mig("1g.10gb"), "A100-40GB") == "1g.10gb"  # the double-memory 1g there
    assert _on(mig("1g.10gb"), "H100-80GB") == "1g.10gb"  # the plain 1g there


def test_a_shape_resolves_to_that_shape_on_every_model() -> None:
    assert _on(mig("3g"), "A100-40GB") == "3g.20gb"
    assert _on(mig("3g"), "H200-141GB") == "3g.71gb"
    assert _on(mig("3g"), "A30-24GB") is None
    assert _on(mig("1g.2x"), "H100-80GB") == "1g.20gb"
    assert _on(mig("7g"), "B200-180GB") == "7g.180gb"


def test_a_sized_request_takes_the_smallest_fitting_profile_on_each_model() -> None:
    req = sized(1, 15)
    assert _on(req, "A100-40GB") == "3g.20gb"  # 1g.10gb and 2g.10gb are too small
    assert _on(req, "A100-80GB") == "1g.20gb"
    assert _on(req, "H200-141GB") == "1g.18gb"
    assert _on(sized(2, 20), "A100-40GB") == "3g.20gb"  # 20 GB fits 19.62 GiB
    assert _on(sized(2, 20), "H100-80GB") == "2g.20gb"
    assert _on(sized(3, 40), "A100-40GB") == "7g.40gb"
    assert _on(sized(7, 200), "B200-180GB") is None


def test_a_sized_request_never_resolves_to_a_media_extension_profile_unless_asked() -> None:
    for model in GEO.models:
        p = resolve_profile(sized(1, 1), model)
        assert p is not None and not p.media_extensions
    me = resolve_profile(sized(1, 1), GEO.model("A100-40GB"), include_me=True)
    assert me is not None and me.memory_slices == 1


def test_whole_gpu_and_shared_requests_resolve_to_no_mig_profile() -> None:
    assert resolve_profile(Demand(kind="gpus", gpus=2).check(), GEO.model("A100-40GB")) is None
    assert resolve_profile(Demand(kind="shared").check(), GEO.model("A100-40GB")) is None
    assert full_profile(GEO.model("A100-40GB")).name == "7g.40gb"
    assert full_profile(GEO.model("A30-24GB")).name == "4g.24gb"


@pytest.mark.parametrize(
    "demand",
    [
        Demand(kind="mig"),
        Demand(kind="mig", profile="1g.5gb", compute_slices=1),
        Demand(kind="mig", compute_slices=1),
        Demand(kind="mig", profile="1g.5gb", gpus=2),
        Demand(kind="gpus", profile="1g.5gb"),
        Demand(kind="shared", gpus=2),
    ],
)
def test_contradictory_requests_are_refused(demand: Demand) -> None:
    with pytest.raises(RequestError):
        demand.check()


@pytest.mark.parametrize(("fraction", "shape"), [(0.1, "1g"), (0.25, "2g"), (0.4, "3g"), (0.5, "4g"),
                                                 (0.9, "7g")])
def test_a_gpu_fraction_maps_to_the_smallest_covering_profile(fraction: float, shape: str) -> None:
    assert profile_for_fraction(GEO.model("A100-40GB"), fraction).shape == shape


def test_a_fraction_outside_zero_one_is_refused() -> None:
    with pytest.raises(RequestError):
        profile_for_fraction(GEO.model("A100-40GB"), 1.5)
