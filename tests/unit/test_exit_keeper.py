"""The exit keeper: a workload's status recorded where an executor that did not start it can read it."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.executor.process import KEEPER, take_status

pytestmark = pytest.mark.unit


def keep(tmp_path: Path, *argv: str, options: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], Path]:
    status = tmp_path / "w.exit"
    status.write_bytes(b"")
    proc = subprocess.Popen(
        [sys.executable, "-I", str(KEEPER), str(status), *options, "--", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    return proc, status


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


@pytest.mark.parametrize("code", [0, 3])
def test_the_workloads_exit_code_is_recorded_and_passed_on(tmp_path: Path, code: int) -> None:
    proc, status = keep(tmp_path, *py(f"import sys; print('out'); sys.exit({code})"))
    out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (code, b"out\n")
    assert take_status(status) == code
    assert not status.exists() and take_status(status) is None  # read once


def test_a_workload_killed_by_a_signal_is_recorded_as_minus_the_signal(tmp_path: Path) -> None:
    proc, status = keep(tmp_path, *py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL
    assert take_status(status) == -signal.SIGKILL


def test_a_stop_of_the_group_ends_the_workload_and_the_keeper_records_it(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc, status = keep(tmp_path, *py(f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"))
    for _ in range(1000):
        if ready.exists():
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)  # what the executor's stop sends
    proc.communicate(timeout=30)
    assert take_status(status) == -signal.SIGTERM


def test_a_program_that_does_not_exist_is_recorded_as_127_with_the_reason(tmp_path: Path) -> None:
    proc, status = keep(tmp_path, "/nonexistent/trainer")
    out, _ = proc.communicate(timeout=30)
    assert take_status(status) == 127
    assert b"'/nonexistent/trainer' not found" in out


def test_a_status_file_it_cannot_write_still_leaves_the_status_in_its_exit_code(tmp_path: Path) -> None:
    missing = tmp_path / "gone" / "w.exit"
    done = subprocess.run([sys.executable, "-I", str(KEEPER), str(missing), "--", *py("raise SystemExit(5)")],
                          capture_output=True, timeout=30)
    assert done.returncode == 5 and b"cannot record the status" in done.stderr


@pytest.mark.parametrize("options", [(), ("--user",), ("--shell", "1"), ("--user", "x")])
def test_malformed_keeper_arguments_are_refused_with_the_usage(tmp_path: Path, options: tuple[str, ...]) -> None:
    status = tmp_path / "w.exit"
    status.write_bytes(b"")
    args = [str(status), *options, "--"] + ([] if not options else ["true"])
    done = subprocess.run([sys.executable, "-I", str(KEEPER), *args], capture_output=True, timeout=30)
    assert done.returncode == 2 and b"usage: exitkeeper.py" in done.stderr
    assert take_status(status) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_the_workload_runs_as_the_given_user_while_the_keeper_stays_the_executors(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    options = ("--user", str(nobody.pw_uid), "--group", str(nobody.pw_gid), "--groups", "")
    proc, status = keep(tmp_path, "/usr/bin/id", "-u", options=options)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == str(nobody.pw_uid).encode()
    assert take_status(status) == 0  # written by the keeper, which the user could not have done here
