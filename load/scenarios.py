"""The load scenarios: steady rates with matching exits on 2×8 and 64×8 simulated GPUs, burst, soak.

"Matching exits": each job's ``duration_hint_s`` is chosen so that, at the scenario's arrival rate, the
simulated cluster settles at ``fill`` of its compute slices busy (Little's law: busy = rate × duration ×
slices per job), so exits keep pace with arrivals and the stack is measured in a steady state rather than
filling up and queueing. A scenario only describes the load and the stack it expects; it does not start
the stack (``migsched up`` with the executor settings printed by ``python -m load scenarios``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from load.generator import LoadError, phased

COMPUTE_SLICES_PER_GPU = 7  # A100/H100 class: 7 compute slices per GPU in MIG mode
DEFAULT_MIX: Mapping[str, float] = {"1g.5gb": 0.7, "2g.10gb": 0.2, "3g.20gb": 0.1}


def compute_slices(profile: str) -> int:
    m = re.match(r"^(\d+)g\.", profile)
    if not m:
        raise LoadError(f"cannot tell the compute slices of profile {profile!r}")
    return int(m.group(1))


@dataclass(frozen=True)
class Budget:
    """The budgets of the live stack on a 2-core machine; None = not checked in this scenario."""

    p99_submit_to_command_ms: float | None = 50.0
    min_rate_share: float | None = 0.98
    """Delivered command rate / offered rate below which the stack did not sustain the load."""
    max_rss_drift_pct: float | None = 10.0
    """Judged over the soak only (None elsewhere): in a 60-s run the executors' window of remembered commands
    (60 s) is still filling, so their RSS grows by design and a verdict would say nothing; the RSS table still
    shows every drift."""
    max_wait_s: float | None = None
    """Burst: the worst submit → command wait, i.e. how long the backlog took to drain (our own target)."""


BURST_BUDGET = Budget(p99_submit_to_command_ms=None, min_rate_share=None, max_wait_s=10.0, max_rss_drift_pct=None)
STEADY_BUDGET = Budget(max_rss_drift_pct=None)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    phases: tuple[tuple[float, float], ...]
    """(arrivals per second, seconds) in order."""
    nodes: int
    gpus_per_node: int = 8
    model: str = "A100-SXM4-40GB"
    profile_mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    fill: float = 0.5
    soak: bool = False
    warmup_s: float = 10.0
    budget: Budget = Budget()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def base_rate(self) -> float:
        return self.phases[0][0]

    @property
    def duration_s(self) -> float:
        return sum(d for _, d in self.phases)

    @property
    def jobs(self) -> int:
        return sum(round(r * d) for r, d in self.phases)

    def mean_slices(self) -> float:
        total = sum(self.profile_mix.values())
        return sum(w * compute_slices(p) for p, w in self.profile_mix.items()) / total

    def duration_hint_s(self) -> float:
        """Run time per job that keeps ``fill`` of the cluster busy at the base rate (Little's law)."""
        busy = self.fill * self.gpus * COMPUTE_SLICES_PER_GPU
        return round(busy / (self.base_rate * self.mean_slices()), 4)

    def schedule(self, duration_s: float | None = None) -> Iterator[float]:
        """The arrival instants; ``duration_s`` stretches or shrinks every phase in proportion."""
        scale = 1.0 if duration_s is None else duration_s / self.duration_s
        return phased([(r, d * scale) for r, d in self.phases])

    def stack(self) -> str:
        """What the stack under test must run (the executor settings of ``migsched up``)."""
        return (f"{self.nodes} simulated executor node(s) × {self.gpus_per_node} {self.model} "
                f"({self.gpus} GPUs, {self.gpus * COMPUTE_SLICES_PER_GPU} compute slices); "
                f"jobs run {self.duration_hint_s()} s (duration_hint_s)")


def _steady(rate: int, nodes: int, seconds: float = 60.0) -> Scenario:
    shape = f"{nodes}x8"
    return Scenario(f"steady-{rate}-{shape}", f"{rate} arrivals/s for {seconds:.0f} s with matching exits on "
                    f"{nodes} × 8 GPUs", ((float(rate), seconds),), nodes=nodes, budget=STEADY_BUDGET)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    *(_steady(rate, nodes) for nodes in (2, 64) for rate in (500, 1000, 2000)),
    Scenario("burst-64x8", "200/s, then a 2 s burst at 5,000/s (10,000 jobs at once), then 200/s: "
             "how fast the backlog drains", ((200.0, 10.0), (5000.0, 2.0), (200.0, 20.0)), nodes=64,
             fill=0.3, budget=BURST_BUDGET),
    Scenario("soak-1000-64x8", "1,000/s for 10 minutes on 64 × 8 GPUs, sampling each service's RSS",
             ((1000.0, 600.0),), nodes=64, soak=True, warmup_s=60.0),
)}


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise LoadError(f"no scenario {name!r}; scenarios: {', '.join(SCENARIOS)}") from None
