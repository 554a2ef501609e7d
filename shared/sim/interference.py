"""Co-location slowdown: jobs on one GPU contend for the paths MIG does not partition (PCIe, host memory
bandwidth, the copy engines when they are shared).

Model (documented in docs/simulator.md): job j on GPU g runs at speed

    speed_j = 1 / (1 + beta * sum_{k on g, k != j} intensity(class_k) * compute_k / C_g)

where compute_k / C_g is the co-runner's share of the GPU's compute slices. A job alone (or on a full-GPU
instance) runs at speed 1. Remaining work is tracked in "seconds at speed 1"; whenever the set of running
jobs on
a GPU changes, every job there is advanced at its old speed and given its new one, so its exit time moves.
Packing tighter (a higher load threshold t) therefore stretches run times: the trade-off the paper reports
(t = 0.5 costs 15-20 % latency against t = 0.4).
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.sim.config import InterferenceParams


class Interference:
    __slots__ = ("beta", "default", "intensity")

    def __init__(self, params: InterferenceParams) -> None:
        self.beta = params.beta
        self.intensity: Mapping[str, float] = dict(params.intensity)
        self.default = params.default_intensity

    def pressure(self, wclass: str, compute: int, gpu_compute: int) -> float:
        """What one job adds to the contention on its GPU."""
        return self.intensity.get(wclass, self.default) * compute / gpu_compute

    def speed(self, total_pressure: float, own_pressure: float) -> float:
        """Speed of a job given the GPU's total pressure and its own share of it (1.0 = no slowdown)."""
        others = total_pressure - own_pressure
        if others <= 1e-12 or self.beta == 0.0:
            return 1.0
        return 1.0 / (1.0 + self.beta * others)
