"""``migsched up`` supervises its processes: one that dies is started again, with a line saying how it ended,
and one that keeps dying ends the stack with its last log lines."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from migsched.stack import Proc, Stack, StackConfig, StackError

pytestmark = pytest.mark.unit


def test_a_process_that_dies_is_restarted_and_one_that_keeps_dying_is_given_up_on(tmp_path: Path) -> None:
    stack = Stack(StackConfig(run_dir=tmp_path, metrics=False))
    proc = Proc("executor-x", [sys.executable, "-c", "print('cannot start'); raise SystemExit(3)"], {},
                tmp_path / "executor-x.log")
    stack.procs = [proc]
    stack._spawn(proc)
    said: list[str] = []
    with pytest.raises(StackError) as gave_up:
        for _ in range(200):
            assert proc.popen is not None
            proc.popen.wait(timeout=30)
            said += stack.revive(limit=2)
            time.sleep(0.01)
    assert said == ["executor-x exited with 3; restarted (1 of 2)", "executor-x exited with 3; restarted (2 of 2)"]
    assert "executor-x exited with 3 3 times; giving up" in str(gave_up.value)
    assert "cannot start" in str(gave_up.value)
