"""migsched's shared library: geometry, pure policies, simulator, wire schemas, state and bus adapters."""
