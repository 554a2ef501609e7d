"""Shards, the store's scheduling cells: which shard a node, a block or a job lives in, and why a shard without
GPUs leaves its jobs waiting.

A shard's keys share one hash tag (``shared.state.keys``), so every transition within it is one Lua script on one
Redis primary; the functions here are the rules every process applies alike to find a name's shard.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence


def shard_of(name: str, shards: int) -> int:
    """A node's or a job's shard (scheduling cell): stable across processes and restarts."""
    return 0 if shards <= 1 else zlib.crc32(name.encode()) % shards


def empty_shard(shard: int, sizes: Sequence[int]) -> str | None:
    """Why the jobs recorded in ``shard`` cannot be placed while it holds no GPU (``sizes``: the GPUs, or nodes,
    each shard holds): a job is placed only on the GPUs of the shard it lives in, and a new job whose home
    holds none is routed to one that does, but jobs recorded there before its nodes left stay. None when the
    shard holds some, or when no shard does (nothing has registered yet)."""
    if len(sizes) <= 1 or sizes[shard] or not any(sizes):
        return None
    others = ", ".join(str(s) for s, n in enumerate(sizes) if n)
    return (f"shard {shard} holds no GPU while shard(s) {others} do, and a job is placed only on the GPUs of the "
            f"shard it lives in: the jobs recorded there wait until a node registers in it (new jobs go to a "
            f"shard with GPUs); run no more shards (MIGSCHED_SHARDS) than topology blocks (each new block goes "
            f"to the shard holding the fewest), so that every shard holds some")


def block_order(block: str, shards: int) -> list[int]:
    """The shards a new block prefers, in order: its name's (crc32), then the next ones."""
    first = shard_of(block, shards)
    return [(first + k) % shards for k in range(shards)]


def block_shard(block: str, counts: Sequence[int]) -> int:
    """The shard of a new block (a node's ``block`` label), given how many blocks each shard holds: the one
    holding the fewest, ties to the first in ``block_order``. Its nodes all go there, so a gang within the block
    fits in one Lua script. Hashing alone would not do: crc32 of names that differ in their last character
    (``b0``, ``b1``) often agrees modulo a small count, and any hash puts two blocks in one of two shards half
    the time, leaving a shard, and the jobs whose ids fall in it, without a GPU (``lua/block_shard.lua`` is the
    same rule, atomic over the namespace's block map)."""
    return min(block_order(block, len(counts)), key=lambda s: counts[s])
