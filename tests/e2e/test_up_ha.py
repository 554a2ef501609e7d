"""``migsched up --ha --demo``: the stack with two replicas of each service on a NATS cluster and a Redis behind
Sentinel, all started by the command, replays a workload to the end and leaves no server running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.ha, pytest.mark.timeout(240)]


def test_up_ha_runs_the_demo_on_the_ha_servers_and_stops_them(tmp_path: Path) -> None:
    kpis = tmp_path / "kpis.json"
    run = subprocess.run(
        [sys.executable, "-m", "migsched", "up", "--ha", "--demo", "--jobs", "30", "--json-out", str(kpis),
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=220, cwd=tmp_path,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "redis+sentinel://" in out and out.count("nats://127.0.0.1:") >= 3
    assert "balancer-2 ok" in out and "registry-2 ok" in out
    live = json.loads(kpis.read_text())
    live = live.get("live", live)
    assert live["completed"] == 30 and live["rejected"] == 0
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "run" / "ha")], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"servers left running: {leftover.stdout}"
