"""The Grafana dashboard and the Prometheus alert rules in ``deploy/`` read only metrics and labels the services
export; promtool accepts the rules and their unit tests pass; each process registers only its own metrics."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "migsched.json"
ALERTS = ROOT / "deploy" / "prometheus" / "migsched-alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "migsched-alerts.test.yml"
SERVICES = ("services.balancer.service", "services.registry.service", "services.migration_planner.service",
            "services.executor.service", "services.common.stalls")
_METRIC = re.compile(r"\b(migsched_[a-z0-9_]+)\b(\{[^}]*\})?")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_PROMETHEUS_LABELS = {"le", "instance", "job", "pod", "quantile"}


def exported() -> dict[str, set[str]]:
    """Every series name the services can export (counters with ``_total``, histograms with their three
    suffixes), with the label names each takes, as a fresh process sees it after importing every service."""
    code = (
        "import importlib, json\n"
        f"for m in {SERVICES!r}: importlib.import_module(m)\n"
        "from prometheus_client import REGISTRY\n"
        "out = {}\n"
        "for c in list(REGISTRY._names_to_collectors.values()):\n"
        "    for name in REGISTRY._get_names(c):\n"
        "        out[name] = list(getattr(c, '_labelnames', ()))\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {k: set(v) for k, v in json.loads(out.stdout).items() if k.startswith("migsched_")}


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard target and alert rule."""
    dash = json.loads(DASHBOARD.read_text())
    out = [(f"panel {p['title']!r}", t["expr"]) for p in dash["panels"] for t in p.get("targets", ())]
    rules = yaml.safe_load(ALERTS.read_text())
    out += [(f"alert {r['alert']}", r["expr"]) for g in rules["groups"] for r in g["rules"]]
    return out


def test_every_query_names_only_metrics_and_labels_the_services_export() -> None:
    names = exported()
    problems: list[str] = []
    for where, expr in expressions():
        used = _METRIC.findall(expr)
        assert used, f"{where} reads no migsched metric: {expr}"
        labels_here: set[str] = set()
        for name, selector in used:
            if name not in names:
                problems.append(f"{where}: {name} is not exported")
                continue
            labels_here |= names[name]
            for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", selector):
                if label not in names[name]:
                    problems.append(f"{where}: {name} has no label {label!r}")
        for group in _BY.findall(expr):
            for label in filter(None, (g.strip() for g in group.split(","))):
                if label not in labels_here | _PROMETHEUS_LABELS:
                    problems.append(f"{where}: aggregates by {label!r}, which none of its metrics has")
    assert not problems, "\n".join(problems)


def test_the_dashboard_is_a_grafana_dashboard_with_a_datasource_variable() -> None:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]


def test_the_alerts_cover_queue_age_fragmentation_lost_nodes_dead_letters_and_conflicts() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    wanted = {"migsched_pending_oldest_age_seconds", "migsched_fragmentation_rate", "migsched_nodes",
              "migsched_dead_letters_total", "migsched_cas_conflicts_total"}
    assert wanted <= {m for e in exprs.values() for m, _ in _METRIC.findall(e)}
    tested = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == set(exprs), "every alert has a promtool unit test"


def _promtool() -> str | None:
    local = ROOT / ".venv" / "bin" / "promtool"
    return shutil.which("promtool") or (str(local) if local.exists() else None)


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; scripts/test.sh fetches it)")
    for args in (["check", "rules", ALERTS.name], ["test", "rules", ALERT_TESTS.name]):
        r = subprocess.run([promtool, *args], cwd=ALERTS.parent, capture_output=True, text=True,
                           env={**os.environ, "NO_COLOR": "1"})
        assert r.returncode == 0, r.stdout + r.stderr


def test_an_executor_process_exports_no_scheduling_metric_and_a_balancer_no_executor_metric() -> None:
    def names_after(module: str) -> set[str]:
        code = (f"import {module}\nfrom prometheus_client import REGISTRY\n"
                "print('\\n'.join(n for c in list(REGISTRY._names_to_collectors.values()) "
                "for n in REGISTRY._get_names(c)))")
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        return set(r.stdout.split())

    executor = names_after("services.executor.service")
    assert "migsched_executor_commands_total" in executor
    assert not {"migsched_decisions_total", "migsched_pending_jobs", "migsched_commands_total"} & executor
    balancer = names_after("services.balancer.service")
    assert "migsched_decisions_total" in balancer and not any(n.startswith("migsched_executor_") for n in balancer)
