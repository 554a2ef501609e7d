"""The optional parts stay optional: without matplotlib, NVML's binding and hdrhistogram (the ``sim``, ``nvml``
and ``load`` extras), every service starts and ``migsched`` answers, and the simulator writes its tables."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BLOCK = '''
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("matplotlib", "pynvml", "hdrh"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
'''


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_every_service_and_the_cli_load_without_the_optional_extras() -> None:
    code = """
import importlib
for m in ("services.balancer.service", "services.registry.service", "services.migration_planner.service",
          "services.executor.service", "services.executor.sim_backend", "migsched.commands.simulate",
          "migsched.commands.status", "migsched.commands.up"):
    importlib.import_module(m)
from migsched.cli import main
main(["--help"])
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "simulate" in r.stdout and "traces" in r.stdout


def test_a_simulation_without_matplotlib_writes_its_tables_and_says_how_to_get_plots(tmp_path: Path) -> None:
    code = """
import sys
from migsched.cli import main
main(["simulate", "-w", "synthetic", "--jobs", "200", "--cluster", "A100-40GB:8", "-p", "first-fit",
      "--no-progress", "--out", sys.argv[1]])
"""
    r = _run(code, str(tmp_path))
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "report.md").read_text()
    assert "migsched[sim]" in report and (tmp_path / "kpis.json").exists()
    assert not list(tmp_path.glob("*.png"))


def test_the_nvml_codes_are_nvml_s_own() -> None:
    pynvml = pytest.importorskip("pynvml")
    from services.executor import nvml_codes

    for code, name in nvml_codes.NAMES.items():
        assert getattr(pynvml, name) == code, name


def test_the_heavy_dependencies_are_extras_and_dev_installs_them_all() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"])
    for heavy in ("matplotlib", "nvidia-ml-py", "hdrhistogram"):
        assert heavy not in required
    extras = project["optional-dependencies"]
    assert extras["sim"] == ["matplotlib>=3.8"] and extras["nvml"][0].startswith("nvidia-ml-py")
    assert extras["load"][0].startswith("hdrhistogram") and "migsched[sim,nvml,load]" in extras["dev"]
