"""``kustomize build`` for the subset of kustomize that ``deploy/k8s`` uses, so that the tests can render the
overlays where no kustomize binary is installed (neither Debian nor PyPI ships one): ``resources`` (files and
directories with their own kustomization), ``namespace``, ``labels`` (metadata only), ``images``, ``replicas``
and ``patches`` (strategic merge: maps merge, lists of named items merge by name, ``$patch: delete`` removes the
object). A kustomization field outside the subset raises, so a manifest that grows one is noticed here."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "replicas", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}


def build(directory: Path) -> list[dict[str, Any]]:
    k: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - _FIELDS
    if unknown:
        raise ValueError(f"{directory}: kustomization fields not handled: {sorted(unknown)}")
    objs: list[dict[str, Any]] = []
    for r in k.get("resources", []):
        path = directory / r
        objs += build(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for p in k.get("patches", []):
        text = p["patch"] if "patch" in p else (directory / p["path"]).read_text()
        for patch in (d for d in yaml.safe_load_all(text) if d):
            objs = _patched(objs, patch, directory)
    for r in k.get("replicas", []):
        _target(objs, WORKLOADS, r["name"], directory)["spec"]["replicas"] = r["count"]
    for image in k.get("images", []):
        for obj in objs:
            for c in _containers(obj):
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag or 'latest')}"
    for label in k.get("labels", []):
        for obj in objs:
            obj["metadata"].setdefault("labels", {}).update(label["pairs"])
    if "namespace" in k:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
    return objs


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] not in WORKLOADS:
        return []
    pod = obj["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def _target(objs: list[dict[str, Any]], kinds: set[str], name: str, where: Path) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] in kinds and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise ValueError(f"{where}: {len(found)} objects of kind {sorted(kinds)} named {name!r}")
    return found[0]


def _patched(objs: list[dict[str, Any]], patch: dict[str, Any], where: Path) -> list[dict[str, Any]]:
    target = _target(objs, {patch["kind"]}, patch["metadata"]["name"], where)
    if patch.get("$patch") == "delete":
        return [o for o in objs if o is not target]
    merged = merge(target, patch)
    return [merged if o is target else o for o in objs]


def merge(base: Any, patch: Any) -> Any:
    """A strategic merge of ``patch`` into ``base`` (a new value)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(
            isinstance(x, dict) and "name" in x for x in [*base, *patch]):
        out_list = [copy.deepcopy(x) for x in base]
        names = [x["name"] for x in out_list]
        for item in patch:
            if item["name"] in names:
                i = names.index(item["name"])
                out_list[i] = merge(out_list[i], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)
