"""``load/gang_targets.py``: the gang benchmark's verdict reads each target as the issue states it."""

from __future__ import annotations

import pytest

from load.bench_gangs import COLUMNS
from load.gang_targets import GREEDY, REFERENCE, TARGETS, Verdict, table, verdicts

pytestmark = pytest.mark.unit


def _row(big: float = 0.0, p95: float = 10.0, small: float = 10.0, idle: float = 0.0) -> list[float]:
    row = [0.0] * len(COLUMNS)
    for name, value in (("big rejected", big), ("big wait p95 h", p95), ("small wait mean s", small),
                        ("held idle", idle)):
        row[COLUMNS.index(name)] = value
    return row


def _met(found: list[Verdict], label: str) -> dict[str, bool | None]:
    (v,) = [v for v in found if v.label == label]
    return dict(zip(TARGETS, v.met, strict=True))


def test_a_loss_the_seeds_noise_explains_is_no_worse_and_a_steady_one_is_worse() -> None:
    ref = [_row(big=0.02, p95=19.0), _row(big=0.02, p95=19.0), _row(big=0.02, p95=19.0)]
    noisy = [_row(big=0.00, p95=17.0), _row(big=0.05, p95=22.0), _row(big=0.03, p95=19.0)]  # +0.67 pt ± 2.5
    steady = [_row(big=0.025, p95=19.5), _row(big=0.026, p95=19.6), _row(big=0.025, p95=19.5)]  # +0.5 pt each
    found = verdicts({(256, REFERENCE): ref, (256, "noisy"): noisy, (256, "steady"): steady}, COLUMNS)
    assert _met(found, "noisy")["big rejected ≤ reference"] is True
    assert _met(found, "noisy")["big p95 ≤ reference"] is True
    assert _met(found, "steady")["big rejected ≤ reference"] is False
    assert _met(found, "steady")["big p95 ≤ reference"] is False


def test_with_one_seed_any_loss_beyond_the_tolerance_is_worse() -> None:
    found = verdicts({(256, REFERENCE): [_row(big=0.02, p95=19.0)],
                      (256, "within"): [_row(big=0.0205, p95=19.0)],
                      (256, "beyond"): [_row(big=0.0215, p95=19.1)]}, COLUMNS)
    assert _met(found, "within")["big rejected ≤ reference"] is True  # 0.05 point: the matrix's tolerance
    assert _met(found, "within")["big p95 ≤ reference"] is True
    assert _met(found, "beyond")["big rejected ≤ reference"] is False
    assert _met(found, "beyond")["big p95 ≤ reference"] is False


def test_far_fewer_than_greedy_backfill_is_at_most_half_and_none_where_it_rejects_none() -> None:
    found = verdicts({(256, GREEDY): [_row(big=0.04, p95=18.0, small=10.0)],
                      (256, "half"): [_row(big=0.02, p95=17.9, small=11.0)],
                      (256, "more"): [_row(big=0.021, p95=18.0, small=11.1)],
                      (512, GREEDY): [_row(big=0.0, p95=9.0, small=0.0)],
                      (512, "half"): [_row(big=0.0, p95=9.5, small=0.0)],
                      (512, "more"): [_row(big=0.001, p95=8.0, small=1.0)]}, COLUMNS)
    half, more = _met([v for v in found if v.gpus == 256], "half"), _met([v for v in found if v.gpus == 256], "more")
    assert half["big rejected ≤ half of greedy's"] and half["big p95 < greedy's"]
    assert half["small wait ≤ greedy's + 10 %"]  # 11 s against 10: the 10 % allowed
    assert not more["big rejected ≤ half of greedy's"] and not more["big p95 < greedy's"]
    assert not more["small wait ≤ greedy's + 10 %"]
    at_512 = {v.label: dict(zip(TARGETS, v.met, strict=True)) for v in found if v.gpus == 512}
    assert at_512["half"]["big rejected ≤ half of greedy's"] and not at_512["more"]["big rejected ≤ half of greedy's"]
    assert not at_512["half"]["big p95 < greedy's"] and at_512["more"]["big p95 < greedy's"]


def test_a_target_whose_reference_did_not_run_is_not_judged_and_greedy_backfill_is_not_judged_against_itself(
) -> None:
    found = verdicts({(256, GREEDY): [_row()], (256, "migsched"): [_row(idle=0.06)]}, COLUMNS)
    assert [v.label for v in found] == ["migsched"]
    met = _met(found, "migsched")
    assert met["big rejected ≤ reference"] is None and met["big p95 ≤ reference"] is None
    assert met["held idle < 5 %"] is False
    lines = table(found)
    assert lines[2] == "| 256 | migsched | - | - | yes | **no** | yes | **no** |"
