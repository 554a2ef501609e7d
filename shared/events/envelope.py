"""What every message shares: the ``Message`` base (schema version ``v`` and unique ``id``), message ids and
timestamps, and ``DecodeError`` (why a message was refused)."""

from __future__ import annotations

import time
import uuid
from typing import Annotated

import msgspec

from shared.errors import MigschedError
from shared.events.fields import MsgId

SCHEMA_VERSION = 1


class DecodeError(MigschedError, ValueError):
    """A message cannot be decoded or fails validation. ``reason`` is short and specific (it goes into the
    dead-letter message's ``Migsched-Error`` header)."""

    def __init__(self, reason: str, subject: str = "") -> None:
        super().__init__(f"{subject}: {reason}" if subject else reason)
        self.reason = reason
        self.subject = subject


def new_id(prefix: str = "m") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every message: schema version and unique message id."""

    v: Annotated[int, msgspec.Meta(ge=1, le=1000)] = SCHEMA_VERSION
    id: MsgId


def now() -> float:
    return time.time()
