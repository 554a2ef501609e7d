"""What GPUs a simulated cluster has: parsed from ``MODEL:COUNT`` specs or a node file, as nodes of GPUs."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import msgspec

from shared.errors import MigschedError
from shared.mig.geometry import Geometry, GpuModel
from shared.policy.snapshot import GpuView
from shared.sim.errors import ClusterSpecError


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    model: str
    gpus: int
    block: str = ""
    """The node's topology block ('' = none): a gang may have to stay within one."""


class ClusterSpec(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[NodeSpec, ...]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def blocks(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each topology block and its nodes (a ``JobRequest``'s ``domains``)."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            if n.block:
                out.setdefault(n.block, []).append(n.name)
        return tuple((b, tuple(ns)) for b, ns in out.items())

    def label(self) -> str:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.model] = counts.get(n.model, 0) + n.gpus
        return " + ".join(f"{c}x {m}" for m, c in counts.items())


def parse_cluster(specs: Sequence[str], geometry: Geometry, gpus_per_node: int = 8,
                  block_nodes: int = 0) -> ClusterSpec:
    """``["A100-40GB:48", "H100-80GB:16"]`` -> nodes of ``gpus_per_node`` GPUs (the last node of a model may be
    smaller); ``block_nodes`` > 0: every that many nodes, in order, form a topology block ``b<k>``."""
    if gpus_per_node < 1:
        raise ClusterSpecError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    nodes: list[NodeSpec] = []
    for spec in specs:
        name, sep, count_s = spec.rpartition(":")
        if not sep or not name:
            raise ClusterSpecError(f"cluster spec {spec!r} is not MODEL:COUNT (e.g. A100-40GB:64)")
        try:
            count = int(count_s)
        except ValueError:
            raise ClusterSpecError(
                f"cluster spec {spec!r}: GPU count {count_s!r} is not an integer"
            ) from None
        if count < 1:
            raise ClusterSpecError(f"cluster spec {spec!r}: GPU count must be at least 1")
        model = _model(geometry, name, spec)
        while count > 0:
            n = min(gpus_per_node, count)
            block = f"b{len(nodes) // block_nodes}" if block_nodes > 0 else ""
            nodes.append(NodeSpec(name=f"node-{len(nodes):04d}", model=model.name, gpus=n, block=block))
            count -= n
    if not nodes:
        raise ClusterSpecError("the cluster has no GPUs; give --cluster MODEL:COUNT or --nodes-file")
    return ClusterSpec(nodes=tuple(nodes))


def _model(geometry: Geometry, name: str, where: str) -> GpuModel:
    try:
        return geometry.model(name)
    except MigschedError as exc:
        raise ClusterSpecError(f"{where}: {exc}") from None


def load_nodes_file(path: str | Path, geometry: Geometry, model_override: str | None = None) -> ClusterSpec:
    """A CSV with a node name column (``node`` or ``sn``), a GPU count (``gpus`` or ``gpu``) and ``model``, and
    optionally the node's topology ``block``.

    ``model_override`` maps every node to one MIG model (the openb node list names non-MIG models such as
    P100).
    """
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise ClusterSpecError(f"cannot read nodes file {p}: {exc.strerror}") from None
    if not rows:
        raise ClusterSpecError(f"nodes file {p} has no rows")
    cols = set(rows[0])
    name_col = "node" if "node" in cols else "sn" if "sn" in cols else None
    gpu_col = "gpus" if "gpus" in cols else "gpu" if "gpu" in cols else None
    missing = [c for c, v in (("node|sn", name_col), ("gpus|gpu", gpu_col)) if v is None]
    if model_override is None and "model" not in cols:
        missing.append("model")
    if missing:
        raise ClusterSpecError(
            f"nodes file {p} lacks column(s) {', '.join(missing)}; has {', '.join(sorted(cols))}"
        )
    assert name_col is not None and gpu_col is not None
    nodes: list[NodeSpec] = []
    for i, row in enumerate(rows, start=2):
        try:
            n = int(row[gpu_col])
        except ValueError:
            raise ClusterSpecError(f"{p}:{i}: {gpu_col}={row[gpu_col]!r} is not an integer") from None
        if n <= 0:
            continue
        model = _model(geometry, model_override or row["model"], f"{p}:{i}")
        nodes.append(NodeSpec(name=row[name_col], model=model.name, gpus=n, block=row.get("block") or ""))
    if not nodes:
        raise ClusterSpecError(f"nodes file {p} lists no GPUs")
    return ClusterSpec(nodes=tuple(nodes))


def gpu_views(spec: ClusterSpec) -> list[GpuView]:
    return [
        GpuView.build(id=f"{node.name}/gpu{i}", node=node.name, index=i, model=node.model)
        for node in spec.nodes
        for i in range(node.gpus)
    ]
