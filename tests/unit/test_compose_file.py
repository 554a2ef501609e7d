"""docker-compose.yml is a valid Compose file (checked against the vendored Compose Specification schema,
since no Docker engine runs here), runs the whole stack, and every container starts a real entry
point of this project with settings the service actually reads."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from migsched.cli import VERBS
from services.executor.service import ExecutorSettings, parse_gpus
from shared import settings as settings_mod

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())  # resolves <<: merges
    return doc


def test_the_compose_file_is_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    errors = sorted(jsonschema.Draft201909Validator(SCHEMA).iter_errors(compose), key=lambda e: list(e.path))
    assert [f"{list(e.path)}: {e.message}" for e in errors] == []


def test_the_schema_rejects_a_broken_compose_file(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["balancer"]["ports"] = "9101"  # a string where a list is required
    broken["services"]["nats"]["bogus_key"] = 1
    assert len(list(jsonschema.Draft201909Validator(SCHEMA).iter_errors(broken))) >= 2


def test_nats_keeps_jetstream_on_a_volume_and_redis_appends_to_its_log(compose: dict[str, Any]) -> None:
    nats, redis = compose["services"]["nats"], compose["services"]["redis"]
    assert "-js" in nats["command"] and nats["command"][nats["command"].index("-sd") + 1] == "/data"
    assert "nats-data:/data" in nats["volumes"] and "nats-data" in compose["volumes"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert "redis-data:/data" in redis["volumes"] and "redis-data" in compose["volumes"]


def test_jaeger_receives_otlp_from_every_service(compose: dict[str, Any]) -> None:
    jaeger = compose["services"]["jaeger"]
    assert jaeger["image"].startswith("jaegertracing/all-in-one")
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true" and "4318:4318" in jaeger["ports"]
    for name, svc in _ours(compose).items():
        assert svc["environment"]["MIGSCHED_OTLP_ENDPOINT"] == "http://jaeger:4318/v1/traces", name


def test_every_service_and_two_simulated_executors_of_eight_a100s_run(compose: dict[str, Any]) -> None:
    modules = {_module(svc["command"]) for svc in _ours(compose).values() if svc.get("command")}
    assert {"services.balancer", "services.registry", "services.migration_planner"} <= modules
    executors = [
        svc for svc in _ours(compose).values() if _module(svc.get("command", [])) == "services.executor"
    ]
    assert len(executors) == 2
    nodes = {e["environment"]["MIGSCHED_NODE"] for e in executors}
    assert len(nodes) == 2
    for e in executors:
        assert e["environment"]["MIGSCHED_EXECUTOR_BACKEND"] == "sim"
        assert parse_gpus(e["environment"]["MIGSCHED_EXECUTOR_GPUS"]) == ["A100-40GB"] * 8


def test_every_command_is_a_real_entry_point_of_this_project(compose: dict[str, Any]) -> None:
    for name, svc in _ours(compose).items():
        argv = list(svc.get("entrypoint", [])) + list(svc.get("command", []))
        if argv[:2] == ["python", "-m"]:
            spec = importlib.util.find_spec(argv[2] + ".__main__")
            assert spec is not None and spec.origin and Path(spec.origin).is_file(), f"{name}: {argv}"
            assert (REPO / Path(*argv[2].split("."))).is_dir(), f"{name}: {argv[2]} is not in this repository"
        else:
            assert argv[0] == "migsched", f"{name}: {argv}"
            assert argv[1] in VERBS and importlib.util.find_spec(f"migsched.commands.{VERBS[argv[1]]}"), name
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'migsched = "migsched.cli:main"' in pyproject  # the console script the cli container calls


def test_every_migsched_variable_in_the_file_is_a_setting_some_service_reads(compose: dict[str, Any]) -> None:
    known: set[str] = set()
    for cls in (
        settings_mod.BalancerSettings,
        settings_mod.RegistrySettings,
        settings_mod.MigrationPlannerSettings,
        ExecutorSettings,
    ):
        known |= {"MIGSCHED_" + f.name.upper() for f in dataclasses.fields(cls)}
    used = {k for svc in _ours(compose).values() for k in svc["environment"] if k.startswith("MIGSCHED_")}
    assert used - known == set()


def test_one_dockerfile_builds_the_image_of_every_service(compose: dict[str, Any]) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for pkg in ("shared", "services", "migsched"):
        assert f"COPY {pkg} ./{pkg}" in dockerfile
    images = {(svc.get("build"), svc.get("image")) for svc in _ours(compose).values()}
    assert images == {(".", "migsched:latest")}


def _ours(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in compose["services"].items() if v.get("image") == "migsched:latest"}


def _module(argv: list[str]) -> str | None:
    return argv[2] if argv[:2] == ["python", "-m"] else None
