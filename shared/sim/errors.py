"""Faults raised by the simulator for bad input: they say which file, column or value is wrong."""

from shared.errors import MigschedError


class SimError(MigschedError):
    """Base of the simulator's faults."""


class WorkloadError(SimError, ValueError):
    """A trace or workload specification cannot be read (missing file or column, bad value, bad mapping)."""


class ClusterSpecError(SimError, ValueError):
    """A cluster specification (``MODEL:COUNT``, node list) is malformed."""


class InvariantError(SimError, AssertionError):
    """The simulated state broke an invariant (double-booked slice, job ended twice): a simulator bug."""


class UnsupportedRunError(SimError, ValueError):
    """A run asks for what the simulator does not model together (tenancy under a policy other than the
    balancer's)."""
