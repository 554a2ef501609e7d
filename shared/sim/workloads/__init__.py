"""Workload sources: the openb pod traces, the DLRM background trace, any CSV via a column mapping, and a
synthetic four-class generator. Each returns a ``shared.sim.jobs.Workload``; ``catalog`` says where the public
traces are read from and where to get them."""
