"""migsched: the MIG-aware GPU cluster scheduler's command-line entry point."""

__version__ = "0.1.0"
