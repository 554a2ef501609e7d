"""The tenancy file: parsing, specific validation errors, priority resolution, diff, hot reload, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from migsched.commands.quota import command as quota_command
from shared.policy.priority import BUILTIN_DEFAULT, PriorityClass, PriorityClasses, UnknownPriorityClassError
from shared.policy.resources import COMPUTE, GPU
from shared.tenancy import (
    ENV_FILE,
    TenancyError,
    TenancyWatcher,
    diff,
    load_tenancy,
    parse_tenancy,
    tenancy_from_env,
)

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quotas.toml"

GOOD = """
[priority_classes.high]
value = 1000
[priority_classes.low]
value = 10
default = true
preemption = "Never"
[cohorts.research]
[tenants.a]
cohort = "research"
priority_class = "high"
quota = { "nvidia.com/mig-2g.20gb" = 4, "nvidia.com/gpu" = 2, compute_slices = 28, memory_gib = 160 }
borrowing_limit = { compute_slices = 7 }
[tenants.b]
cohort = "research"
quota = { compute_slices = 14 }
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(TenancyError) as info:
        parse_tenancy(text, "q.toml")
    return info.value.problems


def test_the_example_file_is_valid() -> None:
    t = load_tenancy(EXAMPLE)
    assert {"team-a", "team-b", "notebooks", "serving"} <= set(t.quotas.tenants)
    assert t.classes.default.name == "gpu-inference-low"


def test_a_valid_file_gives_quotas_cohorts_and_classes() -> None:
    t = parse_tenancy(GOOD)
    a = t.quotas.tenants["a"]
    assert a.quota[GPU] == 2 and a.borrowing_limit == {COMPUTE: 7} and a.cohort == "research"
    assert t.quotas.members["research"] == ("a", "b")
    assert t.priority_of("a").name == "high"
    assert t.priority_of("b").name == "low" and not t.priority_of("b").may_preempt
    assert t.priority_of("b", "high").value == 1000


def test_an_unknown_priority_class_on_a_job_is_a_request_error() -> None:
    with pytest.raises(UnknownPriorityClassError, match="unknown priority class 'urgent'"):
        parse_tenancy(GOOD).priority_of("a", "urgent")


def test_without_classes_the_builtin_default_of_value_zero_applies() -> None:
    assert PriorityClasses().default == BUILTIN_DEFAULT
    assert parse_tenancy("").priority_of("anyone").value == 0


def test_an_unknown_resource_name_is_reported_with_the_known_ones() -> None:
    (p,) = _problems('[tenants.a]\nquota = { cpu = 3 }')
    assert "tenants.a.quota: unknown resource 'cpu'" in p and "compute_slices" in p


def test_a_misspelt_mig_profile_gets_a_suggestion() -> None:
    (p,) = _problems('[tenants.a]\nquota = { "nvidia.com/mig-2g.21gb" = 1 }')
    assert "unknown MIG profile '2g.21gb'" in p and "did you mean" in p and "2g.20gb" in p


def test_negative_and_fractional_counts_are_rejected() -> None:
    probs = _problems('[tenants.a]\nquota = { "nvidia.com/gpu" = -1, "nvidia.com/gpu.shared" = 1.5, '
                      'memory_gib = 2.5 }')
    assert len(probs) == 2
    assert any('"nvidia.com/gpu": must not be negative' in p for p in probs)
    assert any("whole number" in p for p in probs)


def test_an_unknown_cohort_is_reported() -> None:
    (p,) = _problems('[tenants.a]\ncohort = "nope"')
    assert "tenants.a.cohort: unknown cohort 'nope'" in p


def test_two_default_classes_are_reported() -> None:
    (p,) = _problems("[priority_classes.x]\nvalue = 1\ndefault = true\n"
                     "[priority_classes.y]\nvalue = 2\ndefault = true")
    assert "more than one default class (x, y)" in p


def test_a_bad_preemption_policy_or_missing_value_is_reported() -> None:
    probs = _problems('[priority_classes.x]\nvalue = 1\npreemption = "Sometimes"\n[priority_classes.y]\n')
    assert any("priority_classes.x" in p and "Sometimes" in p for p in probs)
    assert any("priority_classes.y: missing 'value'" in p for p in probs)


def test_borrowing_without_a_cohort_and_unknown_keys_are_reported() -> None:
    probs = _problems("[tenants.a]\nborrowing_limit = { compute_slices = 1 }\nquotas = {}\n[extra]\n")
    assert any("borrows only within a cohort" in p for p in probs)
    assert any("unknown key 'quotas'" in p for p in probs)
    assert any("top level: unknown key 'extra'" in p for p in probs)


def test_every_problem_is_listed_at_once_with_the_file_name() -> None:
    with pytest.raises(TenancyError) as info:
        parse_tenancy('[tenants.a]\ncohort = "x"\nquota = { cpu = 1 }', "q.toml")
    assert str(info.value).startswith("q.toml: 2 problems")


def test_invalid_toml_is_a_tenancy_error() -> None:
    assert "not valid TOML" in _problems("[tenants.a\n")[0]


def test_a_missing_file_is_a_tenancy_error(tmp_path: Path) -> None:
    with pytest.raises(TenancyError, match="cannot read"):
        load_tenancy(tmp_path / "absent.toml")


def test_the_environment_variable_names_the_file_and_unset_means_no_quotas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_FILE, raising=False)
    assert not tenancy_from_env().quotas.tenants
    f = tmp_path / "t.toml"
    f.write_text(GOOD)
    monkeypatch.setenv(ENV_FILE, str(f))
    assert set(tenancy_from_env().quotas.tenants) == {"a", "b"}


def test_diff_names_what_a_reload_changed() -> None:
    old = parse_tenancy(GOOD)
    new = parse_tenancy(GOOD.replace("compute_slices = 14", "compute_slices = 21") + '[tenants.c]\n')
    d = diff(old, new)
    assert d.tenants_added == ("c",) and d.tenants_changed == ("b",) and not d.tenants_removed
    assert diff(old, old).empty


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _touch(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))


def test_the_watcher_reloads_a_changed_file_once_its_poll_interval_has_passed(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    _touch(f, GOOD, 1_000_000_000)
    clock = _Clock()
    w = TenancyWatcher(f, clock, interval_s=5.0)
    _touch(f, GOOD + "[tenants.c]\n", 2_000_000_000)
    assert w.poll() is None  # not yet time
    clock.t = 5.0
    r = w.poll()
    assert r is not None and r.ok and r.diff is not None and r.diff.tenants_added == ("c",)
    assert "c" in w.current.quotas.tenants
    clock.t = 10.0
    assert w.poll() is None  # unchanged


def test_a_reload_that_fails_validation_keeps_the_previous_config_and_reports_the_error(
    tmp_path: Path,
) -> None:
    f = tmp_path / "t.toml"
    _touch(f, GOOD, 1_000_000_000)
    clock = _Clock()
    w = TenancyWatcher(f, clock, interval_s=1.0)
    before = w.current
    _touch(f, '[tenants.a]\ncohort = "nope"\n', 2_000_000_000)
    clock.t = 1.0
    r = w.poll()
    assert r is not None and not r.ok and "unknown cohort 'nope'" in r.error
    assert w.current is before and "nope" in w.error
    _touch(f, GOOD, 3_000_000_000)
    clock.t = 2.0
    ok = w.poll()
    assert ok is not None and ok.ok and w.error == ""


def test_a_priority_class_is_a_frozen_value_with_bounds() -> None:
    c = PriorityClass(name="x", value=1)
    assert c.may_preempt and c.preemptible and not c.default


def test_quota_check_prints_tenants_and_cohorts_and_exits_zero() -> None:
    result = CliRunner().invoke(quota_command, ["check", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "team-a" in result.output and "research" in result.output and "valid" in result.output


def test_quota_check_of_an_invalid_file_exits_one_with_the_problems(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('[tenants.a]\nquota = { cpu = 1 }\n')
    result = CliRunner().invoke(quota_command, ["check", str(f)])
    assert result.exit_code == 1 and "unknown resource 'cpu'" in result.output


def test_quota_show_reports_usage_against_quota_and_what_is_borrowed(tmp_path: Path) -> None:
    u = tmp_path / "usage.json"
    u.write_text(json.dumps({"team-a": {"compute_slices": 30}}))
    result = CliRunner().invoke(quota_command, ["show", str(EXAMPLE), "--usage", str(u), "--json"])
    assert result.exit_code == 0, result.output
    rows = {(r["tenant"], r["resource"]): r for r in json.loads(result.output)}
    row = rows[("team-a", "compute_slices")]
    assert (row["used"], row["quota"], row["max_with_borrowing"], row["borrowed"]) == (30, 28, 42, 2)


def test_a_jobs_priority_comes_from_its_class_else_its_explicit_value_else_the_default() -> None:
    t = parse_tenancy(GOOD + "[tenants.c]\n")
    assert t.job_priority("a", None, 5) == (t.classes.get("high"), 1000)  # the tenant's class wins
    assert t.job_priority("c", "high", 5)[1] == 1000
    assert t.job_priority("c", None, 5) == (t.classes.default, 5)
    assert t.job_priority("c", None, 0) == (t.classes.default, 10)
