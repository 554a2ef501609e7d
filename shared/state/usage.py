"""Tenants' usage counters of a shard (``{ns:s}:usage``): what the shard's active jobs are charged, per tenant
and resource, kept by the transitions themselves so that ``reserve`` can hold a placement to its tenant's
quota atomically (``shared.policy.shard_quota.QuotaLimit``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SEP = "\t"
"""Between the tenant and the resource in a counter's field."""


def field(tenant: str, resource: str) -> str:
    return f"{tenant}{SEP}{resource}"


def decode(raw: Mapping[Any, Any]) -> dict[str, dict[str, float]]:
    """The counters hash as tenant -> resource -> amount (rounding dust below 1e-9 left out)."""
    out: dict[str, dict[str, float]] = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else str(k)
        tenant, _, resource = key.partition(SEP)
        amount = float(v)
        if amount > 1e-9:
            out.setdefault(tenant, {})[resource] = amount
    return out
