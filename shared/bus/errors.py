"""The bus's faults: one small hierarchy under ``MigschedError``, the same for every transport."""

from __future__ import annotations

from shared.errors import Unavailable


class BusError(Unavailable):
    """The broker refused an operation: stream set-up, a publish no stream acknowledged, a consumer it cannot make."""


class SubscriptionClosed(BusError):
    """The connection under a subscription is closed for good: its consumer stops fetching."""
