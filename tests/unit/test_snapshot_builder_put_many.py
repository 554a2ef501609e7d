"""``SnapshotBuilder.put_many`` writes the same columns as one ``put`` per GPU, in order."""

from __future__ import annotations

import math
import random

import msgspec
import numpy as np
import pytest

from shared.mig.geometry import default_geometry
from shared.policy.snapshot import GpuView, InstanceView, SnapshotBuilder

pytestmark = pytest.mark.unit
GEO = default_geometry()
MODELS = ("A100-40GB", "H100-80GB")


def _gpu(rng: random.Random, k: int) -> GpuView:
    """GPU ``k`` (of a random model) with random non-overlapping instances, busy or idle."""
    model = GEO.model(rng.choice(MODELS))
    used, insts = 0, []
    for p in rng.sample(model.profiles, len(model.profiles)):
        for start in p.placements:
            mask = ((1 << p.memory_slices) - 1) << start
            if used & mask or rng.random() < 0.5:
                continue
            used |= mask
            busy = rng.random() < 0.6
            insts.append(InstanceView(
                id=f"g{k}:{p.name}@{start}", profile=p.name, start=start, size=p.memory_slices,
                compute=p.compute_slices, job_id=f"j{k}.{start}" if busy else None,
                migratable=rng.random() < 0.8, latency_sensitive=rng.random() < 0.2,
                ends_at=rng.choice([None, 100.0, 5000.0]) if busy else None,
            ))
    return GpuView.build(id=f"n{k // 8}/{k % 8}", node=f"n{k // 8}", index=k % 8, model=model.name,
                         instances=insts, mig=rng.random() < 0.95, healthy=rng.random() < 0.95)


@pytest.mark.parametrize("seed", range(5))
def test_put_many_equals_put_one_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    one, many = SnapshotBuilder(GEO), SnapshotBuilder(GEO)
    for _ in range(4):
        # new GPUs past the columns' first capacity, changed ones, and one GPU given twice
        batch = [_gpu(rng, rng.randrange(90)) for _ in range(rng.randrange(1, 60))]
        batch.append(batch[0].with_instances(()))
        for g in batch:
            one.put(g)
        many.put_many(batch)
        a, b = one.snapshot(), many.snapshot()
        assert a.gpus == b.gpus and dict(a.position) == dict(b.position)
        for name in ("busy", "idle", "used", "compute", "mig", "healthy", "idle_profiles", "model_idx", "pair",
                     "load_idx", "ok", "load_q", "cu_idx", "idle_starts", "busy_starts", "movable_starts",
                     "movable_drops", "ends", "node_idx", "node_end", "node_empty"):
            x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
            assert x.dtype == y.dtype and np.array_equal(x, y), name


@pytest.mark.parametrize("seed", range(5))
def test_the_kept_expected_ends_and_nodes_equal_those_derived_from_the_gpus(seed: int) -> None:
    from shared.policy.cluster_snapshot import ClusterSnapshot

    rng = random.Random(seed)
    b = SnapshotBuilder(GEO)
    for _ in range(6):  # GPUs added, changed, emptied: the columns follow every put
        for g in [_gpu(rng, rng.randrange(70)) for _ in range(rng.randrange(1, 40))]:
            b.put(g if rng.random() < 0.8 else g.with_instances(()))
        kept = b.snapshot()
        derived = ClusterSnapshot(GEO, kept.gpus, busy=kept.busy, idle=kept.idle, used=kept.used,
                                  compute=kept.compute, mig=kept.mig, healthy=kept.healthy,
                                  idle_profiles=kept.idle_profiles, groups=kept.groups, position=kept.position)
        assert np.array_equal(kept.ends, derived.ends)
        nodes = [g.node for g in kept.gpus]
        # the same partition of GPUs into nodes (numbered by first appearance in each)
        assert all((kept.node_idx[i] == kept.node_idx[j]) == (nodes[i] == nodes[j])
                   for i in range(len(nodes)) for j in range(len(nodes)))


@pytest.mark.parametrize("seed", range(5))
def test_the_kept_node_columns_equal_those_derived_as_gpus_change_and_move_between_nodes(seed: int) -> None:
    from shared.policy.cluster_snapshot import ClusterSnapshot

    rng = random.Random(seed)
    b = SnapshotBuilder(GEO)
    for _ in range(8):
        batch = [_gpu(rng, rng.randrange(70)) for _ in range(rng.randrange(1, 30))]
        # some GPUs re-registered under another node, some emptied
        batch = [msgspec.structs.replace(g, node=f"n{rng.randrange(9)}") if rng.random() < 0.1 else
                 g.with_instances(()) if rng.random() < 0.2 else g for g in batch]
        if rng.random() < 0.5:
            b.put_many(batch)  # below and above the size at which it writes whole columns
        else:
            for g in batch:
                b.put(g)
        kept = b.snapshot()
        derived = ClusterSnapshot(GEO, kept.gpus, busy=kept.busy, idle=kept.idle, used=kept.used,
                                  compute=kept.compute, mig=kept.mig, healthy=kept.healthy,
                                  idle_profiles=kept.idle_profiles, groups=kept.groups, position=kept.position)
        assert np.array_equal(kept.node_end, derived.node_end)
        assert np.array_equal(kept.node_empty, derived.node_empty)
        empty: dict[str, int] = {}
        latest: dict[str, float] = {}
        for g in kept.gpus:
            empty[g.node] = empty.get(g.node, 0) + int(g.mig and g.healthy and not g.busy_mask)
            ends = [i.expected_end for i in g.instances if i.job_id is not None]
            latest[g.node] = max([latest.get(g.node, -math.inf), *ends])
        assert kept.node_empty.tolist() == [empty[g.node] for g in kept.gpus]
        assert kept.node_end.tolist() == [latest[g.node] for g in kept.gpus]
