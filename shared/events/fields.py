"""The bounded scalar types every wire schema is built from: ids, names, priorities, timestamps, reasons.

Bounds (lengths, ranges, patterns) are part of the types, so the JSON Schema (``migsched schema``) gives
publishers in any language what the decoder enforces.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MsgId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+~-]*$")
]
JobId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")]
NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$")]
"""A node name is one NATS subject token: no dots or wildcards."""
GpuId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
InstanceId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=300, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")
]
Tenant = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Priority = Annotated[int, msgspec.Meta(ge=-1000, le=1000)]
Timestamp = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
"""Seconds since the Unix epoch."""
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e8)]
Reason = Annotated[str, msgspec.Meta(max_length=2000)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")]
LabelValue = Annotated[str, msgspec.Meta(max_length=256)]
EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Arg = Annotated[str, msgspec.Meta(max_length=4096)]
ProfileName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Slice = Annotated[int, msgspec.Meta(ge=0, le=7)]
Size = Annotated[int, msgspec.Meta(ge=1, le=8)]
ExitKind = Literal["completed", "failed", "cancelled", "preempted", "lost"]
CommandKind = Literal["place", "stop", "migrate_start", "migrate_stop", "destroy_idle", "resync"]
