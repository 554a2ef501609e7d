"""Workload sources: the openb pod traces, the DLRM background trace, any CSV via a column mapping, and a
synthetic four-class generator. Each returns a ``shared.sim.jobs.Workload``."""

from __future__ import annotations

import os
from pathlib import Path


def traces_dir() -> Path:
    """``MIGSCHED_TRACES_DIR`` or ``<repo>/../shared/traces`` (traces are read in place, never copied)."""
    env = os.environ.get("MIGSCHED_TRACES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return repo.parent / "shared" / "traces"
