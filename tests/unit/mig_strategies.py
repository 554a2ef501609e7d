"""Hypothesis strategies for random legal GPUs and clusters (mixed models, busy and idle instances)."""

from __future__ import annotations

import random
import zlib
from collections import Counter
from typing import Protocol

import msgspec
from hypothesis import strategies as st

from shared.mig.geometry import GpuModel, default_geometry
from shared.mig.occupancy import span
from shared.policy.migration.planner import MigrationParams
from shared.policy.migration.pull_index import PullIndex
from shared.policy.request import Demand, mig
from shared.policy.snapshot import ClusterSnapshot, GpuView, InstanceView, snapshot_of

GEO = default_geometry()
MODELS = ("A100-40GB", "H100-80GB", "H200-141GB", "A30-24GB", "A100-80GB")


def random_instances(
    rng: random.Random, model: GpuModel, gpu_id: str, fill: float, idle_share: float, now: float = 1000.0
) -> list[InstanceView]:
    """A legal random layout: instances added in random order while they fit, until ``fill`` is reached."""
    options = [(p, s) for p in model.profiles for s in p.placements]
    rng.shuffle(options)
    mask = 0
    counts: Counter[str] = Counter()
    out: list[InstanceView] = []
    for p, s in options:
        pm = span(p.memory_slices, s)
        if mask & pm or counts[p.name] >= p.max_count:
            continue
        if mask.bit_count() >= fill * model.memory_slices:
            break
        mask |= pm
        counts[p.name] += 1
        busy = rng.random() >= idle_share
        n = len(out)
        out.append(InstanceView(
            id=f"{gpu_id}/i{n}", profile=p.name, start=s, size=p.memory_slices, compute=p.compute_slices,
            job_id=f"{gpu_id}/j{n}" if busy else None,
            migratable=rng.random() < 0.8, latency_sensitive=rng.random() < 0.2,
            last_moved_at=rng.choice([float("-inf"), now - 30.0, now - 500.0]),
            ends_at=_ends(gpu_id, n, now) if busy else None,
        ))
    return out


def _ends(gpu_id: str, n: int, now: float) -> float | None:
    """An expected end for a busy instance, drawn apart from ``rng`` so that other strategies' draws stay."""
    pick = zlib.crc32(f"{gpu_id}/{n}".encode()) % 6
    return (now - 10.0, now + 60.0, now + 600.0, now + 3600.0, now + 86400.0, None)[pick]


def random_cluster(rng: random.Random, n_gpus: int, models: tuple[str, ...] = MODELS,
                   odd_share: float = 0.05) -> ClusterSnapshot:
    gpus = []
    for i in range(n_gpus):
        model = GEO.model(rng.choice(models))
        gid = f"g{i}"
        gpus.append(GpuView.build(
            id=gid, node=f"n{i // 4}", index=i % 4, model=model.name,
            instances=random_instances(rng, model, gid, rng.random(), rng.choice([0.0, 0.3, 0.7])),
            mig=rng.random() >= odd_share, healthy=rng.random() >= odd_share,
        ))
    return snapshot_of(GEO, gpus)


@st.composite
def clusters(draw: st.DrawFn, max_gpus: int = 12) -> ClusterSnapshot:
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, max_gpus))
    models = tuple(draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True)))
    return random_cluster(random.Random(seed), n, models)


@st.composite
def gpus(draw: st.DrawFn) -> tuple[GpuModel, list[InstanceView]]:
    model = GEO.model(draw(st.sampled_from(MODELS)))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    return model, random_instances(rng, model, "g", draw(st.floats(0, 1)), draw(st.sampled_from([0.0, 0.5])))


def layout_is_legal(model: GpuModel, insts: list[InstanceView]) -> bool:
    """No overlap, legal starts and sizes, max counts respected."""
    mask = 0
    counts: Counter[str] = Counter()
    for i in insts:
        p = model.profile(i.profile)
        if i.start not in p.placements or i.size != p.memory_slices or mask & i.mask:
            return False
        mask |= i.mask
        counts[p.name] += 1
        if counts[p.name] > p.max_count:
            return False
    return True


MIGRATION_PARAMS = st.builds(
    MigrationParams, threshold=st.sampled_from([0.0, 0.2, 0.4, 0.6]), cooldown_s=st.sampled_from([0.0, 120.0]),
    max_moves=st.integers(0, 5), intra=st.booleans(), inter=st.booleans(), pull_into_empty=st.booleans(),
    consolidate=st.booleans(),
)
"""Planner parameters over the range the screens must be exact for."""


def keyed_pull_index(snap: ClusterSnapshot, threshold: float, cooldown_s: float | None, now: float) -> PullIndex:
    """A pull index keyed from the views at ``now`` (the simulator's way)."""
    index = PullIndex(threshold, cooldown_s)
    index.sync(snap)
    for p, g in enumerate(snap.gpus):
        index.update(p, g, now)
    index.follow(snap)
    return index


def change_gpu(gpu: GpuView, what: str, pick: int) -> GpuView:
    """One random change an index must follow: ``health`` flips the GPU's health, ``release`` ends one busy
    instance's job (the instance stays, idle), ``destroy`` removes one idle instance; ``pick`` chooses which."""
    if what == "health":
        return msgspec.structs.replace(gpu, healthy=not gpu.healthy)
    busy = what == "release"
    insts = [i for i in gpu.instances if i.busy == busy]
    if not insts:
        return gpu
    victim = insts[pick % len(insts)]
    if busy:
        return gpu.with_instances(
            [msgspec.structs.replace(i, job_id=None, ends_at=None) if i is victim else i for i in gpu.instances])
    return gpu.with_instances([i for i in gpu.instances if i is not victim])


class GpuIndex(Protocol):
    def update(self, gpu: GpuView) -> None: ...
    def handles(self, demand: Demand) -> bool: ...


def gang_step(gpus: list[GpuView], index: GpuIndex, what: str, pick: int) -> Demand | None:
    """One step of a gang sequence for an incremental index: a change (``change_gpu``) applied to ``gpus`` and the
    index, or ``1g`` or a gang of ``what`` GPUs, returned when the index answers it. An index answers MIG
    requests always, gangs while every GPU is in MIG mode and one node holds them (checked here)."""
    if what in ("release", "destroy", "health"):
        p = pick % len(gpus)
        gpus[p] = change_gpu(gpus[p], what, pick // len(gpus))
        index.update(gpus[p])
        return None
    demand = mig("1g") if what == "1g" else Demand(kind="gpus", gpus=int(what))
    largest = max(Counter(g.node for g in gpus).values())
    one_node = what == "1g" or int(what) <= largest  # a bigger gang spans nodes, which an index leaves alone
    assert index.handles(demand) == (what == "1g" or (all(g.mig for g in gpus) and one_node))
    return demand if index.handles(demand) else None
