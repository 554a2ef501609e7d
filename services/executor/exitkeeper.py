"""Keeps a workload's exit status where a restarted executor can read it.

A process's exit status goes to its parent only. An executor restarted under a running workload (an upgrade, a
crash) adopts the process but is not its parent, so without this it could only report the job "lost" and the
scheduler would run it again from the start, even when it had finished. The executor therefore starts each
workload through this keeper: ``python -I exitkeeper.py STATUS_FILE [--user UID --group GID --groups G,...]
-- ARGV...``. The keeper starts ARGV (never through a shell; as that user when one is given, while the keeper
stays the executor's user, whose interpreter a run-as user may not even be able to read), waits for it and
writes its status (``subprocess``'s: the exit code, or minus the signal number) into STATUS_FILE, which the
executor creates before the start and reads after the end, whether it started the process or adopted it.

The keeper is the leader of the workload's process group, so a stop still reaches the workload and its
children; the keeper outlives their signals (a handler, not an ignore, which the workload would inherit) to
record how the workload ended. It imports nothing but the standard library and runs isolated (``-I``): a
workload's ``PYTHONPATH`` does not affect it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

NOT_FOUND, NOT_EXECUTABLE = 127, 126
"""The shell's codes for a program that does not exist or cannot be run."""


def _outlive(signum: int, frame: object) -> None:
    """The group's signal is meant for the workload, which gets it too; the keeper stays to record its end."""


def _start(argv: list[str], account: dict[str, object]) -> int:
    try:
        child = subprocess.Popen(argv, **account)  # type: ignore[call-overload]
    except FileNotFoundError:
        print(f"exitkeeper: program {argv[0]!r} not found (argv is run without a shell)", file=sys.stderr)
        return NOT_FOUND
    except PermissionError as exc:
        print(f"exitkeeper: cannot execute {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return NOT_EXECUTABLE
    return child.wait()


def _record(path: str, status: int) -> None:
    # Written in place: the executor created the file empty, which reads as "not recorded" until now.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, f"{status}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exitkeeper.py", usage="%(prog)s STATUS_FILE [--user UID --group GID "
                                "--groups GID,...] -- PROGRAM [ARG...]")
    p.add_argument("status_file")
    p.add_argument("--user", type=int)
    p.add_argument("--group", type=int)
    p.add_argument("--groups", type=lambda v: [int(g) for g in v.split(",") if g])
    return p


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        _options().error("a program to run is needed after --")
    split = argv.index("--")
    opts = _options().parse_args(argv[:split])  # a malformed option exits 2 with the usage
    account = {k: v for k, v in (("user", opts.user), ("group", opts.group), ("extra_groups", opts.groups))
               if v is not None}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _outlive)
    status = _start(argv[split + 1 :], account)
    try:
        _record(opts.status_file, status)
    except OSError as exc:  # the executor that started it still learns the status, from this exit code
        print(f"exitkeeper: cannot record the status in {opts.status_file}: {exc.strerror}", file=sys.stderr)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
