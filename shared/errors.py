"""The project's fault hierarchy. "Cannot place" is never an exception: it is a returned result."""


class MigschedError(Exception):
    """Base of every fault raised by migsched code."""


class GeometryError(MigschedError):
    """A geometry table is malformed or inconsistent."""


class UnknownModelError(GeometryError, KeyError):
    """No GPU model matches the name or PCI device id asked for."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else "unknown GPU model"


class RequestError(MigschedError, ValueError):
    """A job request is malformed (unknown profile, impossible size, contradictory fields)."""


class Unavailable(MigschedError):
    """A server the service needs does not answer now (a restart, a failover): no message is at fault, so a
    consumer waits for it instead of spending the messages' deliveries."""
