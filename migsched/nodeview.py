"""``migsched status`` for a large cluster: one row per node instead of one per GPU.

A row of 8 memory slices per GPU reads well for a few dozen GPUs; at hundreds, the jobs table and the holds are
pages below. A node row says what an operator looks for first: the node's block, its GPUs by kind, one mark per
GPU (full, partly used, empty, unhealthy), how many GPUs a gang could take there now, and the mean load.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from migsched.clusterview import ClusterView, GpuRow

FULL, PART, EMPTY, SICK = "█", "▒", "·", "x"
PER_GPU_MAX = 64
"""More GPUs than this are listed one row per node by default (``migsched status --by-gpu`` lists every GPU)."""


def mark(g: GpuRow) -> str:
    """One character for a GPU: full, partly used, empty (nothing running: idle instances count as empty), or
    unhealthy."""
    if not g.healthy:
        return SICK
    busy = [i for i in g.instances if i.state != "idle"]
    if not busy:
        return EMPTY
    return FULL if g.load >= 0.999 or (not g.mig and not g.replicas) else PART


def kinds(gpus: Sequence[GpuRow]) -> str:
    """The node's GPUs by kind: ``8 MIG``, ``4 MIG + 4 plain``."""
    mig = sum(1 for g in gpus if g.mig)
    parts = [f"{mig} MIG"] if mig else []
    if len(gpus) > mig:
        parts.append(f"{len(gpus) - mig} plain")
    return " + ".join(parts)


def node_table(view: ClusterView, title: str) -> Table:
    by_node: dict[str, list[GpuRow]] = {}
    for g in view.gpus:
        by_node.setdefault(g.node, []).append(g)
    t = Table(title=f"{title} — {len(view.gpus)} GPUs on {len(by_node)} nodes "
                    f"({FULL} full, {PART} partly used, {EMPTY} empty, {SICK} unhealthy)", title_justify="left")
    t.add_column("node", overflow="fold")
    t.add_column("block", overflow="fold")
    t.add_column("GPUs", no_wrap=True)
    t.add_column("per GPU", overflow="fold")
    t.add_column("empty", justify="right", no_wrap=True)
    t.add_column("load", justify="right", no_wrap=True)
    for node, gpus in sorted(by_node.items()):
        name = node + (" (lost)" if view.nodes.get(node) == "lost" else "")
        marks = "".join(mark(g) for g in sorted(gpus, key=lambda g: g.index))
        empty = marks.count(EMPTY)
        load = sum(g.load for g in gpus) / len(gpus)
        t.add_row(name, view.blocks.get(node, "-"), kinds(gpus), Text(marks, style="green" if empty < len(gpus)
                                                                          else "dim"),
                  str(empty), f"{load:.2f}")
    return t
