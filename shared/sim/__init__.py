"""Discrete-event simulator: replays workloads through the same policy functions the services use.

``engine`` is the event loop, ``cluster`` the simulated MIG state, ``interference`` the co-location slowdown,
``workloads`` the trace loaders and generators, ``metrics`` the KPIs, ``experiment`` the multi-policy runs,
``report``/``plots`` the outputs. Everything runs on a virtual clock with randomness handed in.
"""
