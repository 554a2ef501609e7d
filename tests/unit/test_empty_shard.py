"""Why the jobs recorded in a shard cannot be placed: it holds no GPU while another shard does."""

from __future__ import annotations

import pytest

from shared.state import empty_shard

pytestmark = pytest.mark.unit


def test_an_empty_shard_beside_shards_with_gpus_names_them_and_the_setting() -> None:
    why = empty_shard(1, [4, 0, 8, 0])
    assert why is not None
    assert why.startswith("shard 1 holds no GPU while shard(s) 0, 2 do")
    assert "the jobs recorded there wait until a node registers in it" in why and "MIGSCHED_SHARDS" in why


@pytest.mark.parametrize(("shard", "sizes"), [(0, [0]), (0, [3]), (1, [0, 0, 0]), (2, [1, 2, 5])])
def test_a_single_shard_one_with_gpus_or_a_cluster_nothing_registered_in_yet_strands_nothing(
    shard: int, sizes: list[int]
) -> None:
    assert empty_shard(shard, sizes) is None
