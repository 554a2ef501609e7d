"""The README's promises stay true: its configuration tables match the settings classes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_lists_every_configuration_variable_with_its_current_default() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_config.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test.sh" in readme
    assert "./scripts/test.sh" in ci
