"""Which failures of a store call mean "Redis is not there right now" rather than "this message is wrong".

A primary that died, one that a failover demoted (``READONLY``), a new one that refuses writes until a replica
is back (``NOREPLICAS``), no primary named yet by the sentinels, a connection refused or timed out: each passes
once a server answers again, and retrying the same message then succeeds.
"""

from __future__ import annotations

from redis.exceptions import BusyLoadingError, ConnectionError, ReadOnlyError, ResponseError, TimeoutError

from shared.errors import Unavailable

_TRANSIENT_REPLIES = ("NOREPLICAS", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a server not answering now."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, Unavailable | ConnectionError | TimeoutError | BusyLoadingError | ReadOnlyError):
            return True
        if isinstance(e, ResponseError) and str(e).startswith(_TRANSIENT_REPLIES):
            return True
        e = e.__cause__ or e.__context__
    return False
