"""``deploy/k8s``: the kustomize base and its overlays render to objects the Kubernetes schemas accept
(kubernetes-validate, offline), and they are a deployment that runs: every workload probes the endpoints the
services serve, requests resources and reads only settings the services know and objects the render holds; the
schedulers run two replicas that a drain cannot both take; Prometheus finds every metrics port."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from services.executor.service import ExecutorSettings
from shared import settings as settings_mod
from tests.kustomize_lite import WORKLOADS, build

pytestmark = pytest.mark.unit
K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES = "1.30"
TREES = {"base": K8S / "base", "production": K8S / "overlays" / "production", "sim": K8S / "overlays" / "sim"}
SCHEDULERS = ("balancer", "registry", "migration-planner")
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
KNOWN = {"MIGSCHED_" + f.name.upper()
         for cls in (settings_mod.BalancerSettings, settings_mod.RegistrySettings,
                     settings_mod.MigrationPlannerSettings, ExecutorSettings)
         for f in dataclasses.fields(cls)}


@pytest.fixture(scope="module", params=sorted(TREES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, build(TREES[request.param])


def by_kind(objs: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in kinds]


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def test_every_object_is_valid_against_the_kubernetes_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    for obj in objs:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            assert obj["spec"]["selector"]["matchLabels"] and obj["spec"]["endpoints"]
            continue
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_the_validator_refuses_a_broken_object() -> None:
    deployment = next(o for o in build(TREES["base"]) if o["kind"] == "Deployment")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_every_container_is_probed_where_its_service_answers_and_requests_resources(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objs = rendered
    for w in by_kind(objs, *WORKLOADS):
        for c in pod(w)["containers"]:
            where = f"{w['kind']} {w['metadata']['name']}"
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env["MIGSCHED_METRICS_PORT"] == str(ports["metrics"]), where  # probes and metrics: one port
            assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, where
            assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, where
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and c["resources"]["limits"]["memory"]
            assert c["command"][:2] == ["python", "-m"] and importlib.util.find_spec(c["command"][2] + ".__main__")


def test_every_setting_is_one_a_service_reads_and_every_reference_is_in_the_render(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objs = rendered
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for cm in by_kind(objs, "ConfigMap"):
        assert set(cm["data"]) - KNOWN == set()
    for s in by_kind(objs, "Secret"):
        assert {k for k in s["stringData"] if k.startswith("MIGSCHED_")} - KNOWN == set()
    for w in by_kind(objs, *WORKLOADS):
        for c in pod(w)["containers"]:
            assert {e["name"] for e in c.get("env", []) if e["name"].startswith("MIGSCHED_")} - KNOWN == set()
            for ref in c.get("envFrom", []):
                kind, name = ("ConfigMap", ref["configMapRef"]["name"]) if "configMapRef" in ref else (
                    "Secret", ref["secretRef"]["name"])
                assert (kind, name) in names, (w["metadata"]["name"], kind, name)
        for v in pod(w).get("volumes", []):
            if "secret" in v:
                assert ("Secret", v["secret"]["secretName"]) in names


def test_each_scheduler_runs_replicas_a_drain_cannot_all_take(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    tree, objs = rendered
    pdbs = by_kind(objs, "PodDisruptionBudget")
    for name in SCHEDULERS:
        (d,) = [o for o in by_kind(objs, "Deployment") if o["metadata"]["name"] == name]
        labels = d["spec"]["template"]["metadata"]["labels"]
        if tree != "sim":
            assert d["spec"]["replicas"] >= 2, name
        budget = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(budget) == 1 and budget[0]["spec"]["minAvailable"] == 1, name
        # each scheduler logs in as its own NATS and Redis user
        secret = next(r["secretRef"]["name"] for c in pod(d)["containers"] for r in c["envFrom"] if "secretRef" in r)
        (s,) = [o for o in by_kind(objs, "Secret") if o["metadata"]["name"] == secret]
        assert all(u.split("://", 1)[1].startswith(f"{name}:") for u in s["stringData"]["MIGSCHED_NATS_URL"].split(","))
        assert s["stringData"]["MIGSCHED_REDIS_URL"].split("://", 1)[1].startswith(f"{name}:")


def test_prometheus_finds_every_workloads_metrics_port(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    (monitor,) = by_kind(objs, "ServiceMonitor")
    watched = [s for s in by_kind(objs, "Service")
               if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    for w in by_kind(objs, *WORKLOADS):
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert any(s["spec"]["selector"].items() <= labels.items()
                   and [p["targetPort"] for p in s["spec"]["ports"]] == ["metrics"] for s in watched), \
            w["metadata"]["name"]


def test_every_executor_reads_its_own_nodes_password() -> None:
    for tree in ("base", "sim"):
        objs = build(TREES[tree])
        (secret,) = [s for s in by_kind(objs, "Secret") if s["metadata"]["name"] == "migsched-executor-passwords"]
        (w,) = [o for o in by_kind(objs, *WORKLOADS) if "services.executor" in pod(o)["containers"][0]["command"]]
        env = {e["name"]: e.get("value") for e in pod(w)["containers"][0]["env"]}
        assert env["MIGSCHED_NATS_URL"].startswith("nats://executor-$(MIGSCHED_NODE)@")
        assert env["MIGSCHED_NATS_PASSWORD_FILE"].endswith("/$(MIGSCHED_NODE)")
        if tree == "sim":  # the StatefulSet's pods are its nodes: a key for each
            assert {f"sim-node-{i}" for i in range(w["spec"]["replicas"])} <= set(secret["stringData"])


def test_the_overlays_change_what_they_say() -> None:
    base, prod, sim = (build(TREES[t]) for t in ("base", "production", "sim"))
    config = {t: next(o for o in objs if o["kind"] == "ConfigMap")["data"]
              for t, objs in (("base", base), ("production", prod))}
    assert config["base"]["MIGSCHED_STREAM_REPLICAS"] == "1" and config["production"]["MIGSCHED_STREAM_REPLICAS"] == "3"
    prod_secrets = [o for o in by_kind(prod, "Secret") if "MIGSCHED_REDIS_URL" in o.get("stringData", {})]
    assert prod_secrets and all(s["stringData"]["MIGSCHED_REDIS_URL"].startswith("redis+sentinel://")
                                for s in prod_secrets)
    assert all(c["image"] == "registry.example.com/migsched:0.1.0" for w in by_kind(prod, *WORKLOADS)
               for c in pod(w)["containers"])
    assert not by_kind(sim, "DaemonSet") and by_kind(sim, "StatefulSet")
    assert by_kind(base, "DaemonSet")[0]["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/mig.capable": "true"}


def test_the_nats_and_redis_chart_values_give_a_replicated_broker_and_a_watched_primary() -> None:
    nats = yaml.safe_load((K8S / "nats-values.yaml").read_text())
    assert nats["config"]["cluster"] == {"enabled": True, "replicas": 3}
    assert nats["config"]["jetstream"]["fileStore"]["enabled"] is True
    redis = yaml.safe_load((K8S / "redis-values.yaml").read_text())
    assert redis["architecture"] == "replication" and redis["sentinel"]["enabled"] is True
    assert redis["sentinel"]["masterSet"] == "migsched"  # the service name in the overlay's redis+sentinel URLs
    assert "min-replicas-to-write 1" in redis["commonConfiguration"] and "appendonly yes" in redis[
        "commonConfiguration"]
