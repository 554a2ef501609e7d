"""A dead letter's reason as a metric label: the consumer loop's words, sorted into a closed set."""

from __future__ import annotations

from prometheus_client import Counter

DEAD_LETTERS = Counter(
    "migsched_dead_letters_total", "Messages a consumer dead-lettered, by reason (see ``reason_class``).",
    ["consumer", "reason"],
)
_REASONS = (("undecodable", "undecodable"), ("malformed JSON", "malformed"), ("exceeds", "too_large"),
            ("deliveries", "max_deliveries"), ("in a message on", "wrong_node"), ("unknown profile", "invalid"),
            ("invalid", "invalid"))


def reason_class(reason: str) -> str:
    """A dead letter's reason as a label from a closed set: malformed, too_large, invalid, wrong_node,
    undecodable (a decoder fault), max_deliveries (redelivered until the limit) or handler (the handler
    refused it)."""
    return next((label for word, label in _REASONS if word in reason), "handler")
