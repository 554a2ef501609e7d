"""Reads derived from a store's two primitives (``gpu_ids`` and ``get_gpus``), shared by the Redis store and its
in-memory twin so that both hand the policies exactly the same snapshot."""

from __future__ import annotations

from collections.abc import Sequence

from shared.mig.geometry import Geometry
from shared.policy.snapshot import ClusterSnapshot, SnapshotBuilder
from shared.state.model import StoredGpu


class DerivedReads:
    async def gpu_ids(self, shard: int | None = None) -> list[str]:
        raise NotImplementedError

    async def get_gpus(self, gpu_ids: Sequence[str]) -> list[StoredGpu | None]:
        raise NotImplementedError

    async def load_gpus(self, shard: int | None = None) -> list[StoredGpu]:
        """Every GPU of a shard (all shards when None), in position order."""
        return [g for g in await self.get_gpus(await self.gpu_ids(shard)) if g is not None]

    async def snapshot(
        self, geometry: Geometry, shard: int | None = None
    ) -> tuple[ClusterSnapshot, dict[str, int]]:
        """The policies' view of the shard(s) plus each GPU's version (for compare-and-set)."""
        builder = SnapshotBuilder(geometry)
        vers: dict[str, int] = {}
        for g in await self.load_gpus(shard):
            builder.put(g.view())
            vers[g.id] = g.ver
        return builder.snapshot(), vers
