"""The two numeric helpers every KPI goes through."""

from __future__ import annotations

import numpy as np


def pct(a: np.ndarray, q: float) -> float:
    """The ``q``-th percentile, 0 for no values."""
    return float(np.percentile(a, q)) if a.size else 0.0


def rounded(x: float) -> float:
    """Rounded so the JSON stays readable and identical across platforms' last-bit differences."""
    return round(float(x), 6)
