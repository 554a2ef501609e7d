"""Workload processes bound to MIG instances: argv only, allowlisted environment, optional run-as user.

Output goes to a per-job log file (not a pipe) so that a workload survives an executor restart: a pipe would
break with the executor and kill the job on its next write. Each workload gets its own session (process
group), so stopping it reaches its children and a Ctrl-C to the executor does not reach it. Each is started
through the exit keeper (``exitkeeper``), which records its status in a file beside its log: an executor
restarted under it learns how it ended, and the job is not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import os
import pwd
import re
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from services.executor.backend import InstanceInfo, PermissionDeniedError, WorkloadError, WorkloadSpec
from services.executor.launch import proc_env
from services.executor.workload import GroupRun, Run, RunResult

DEFAULT_ENV_ALLOWLIST: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_*", "TZ", "TMPDIR", "USER", "LOGNAME")
"""Variables a workload may get (shell-style patterns), from the executor's environment or the job spec."""
TAIL_BYTES = 4096
KEEPER = Path(__file__).with_name("exitkeeper.py")
"""Started in front of every workload so that its exit status outlives the executor (``exitkeeper``)."""


def _allowed(name: str, allowlist: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allowlist)


def build_env(
    spec_env: Mapping[str, str],
    *,
    allowlist: Sequence[str],
    mig_uuid: str,
    job_id: str,
    base: Mapping[str, str] | None = None,
    gang_env: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """The workload's environment and the names dropped because the allowlist does not cover them.

    ``CUDA_VISIBLE_DEVICES`` is always the instance's MIG UUID (or, on GPUs not in MIG mode, the ``GPU-`` UUIDs
    of the whole GPUs or the shared GPU): a job can never pick another device. ``gang_env``: the variables of a
    gang's process (``services.executor.launch``), set by the executor, so never filtered.
    """
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if _allowed(k, allowlist)}
    dropped = sorted(k for k in spec_env if not _allowed(k, allowlist) or k == "CUDA_VISIBLE_DEVICES")
    env.update({k: v for k, v in spec_env.items() if k not in dropped})
    env.update(gang_env or {})
    env["CUDA_VISIBLE_DEVICES"] = mig_uuid
    env["MIGSCHED_JOB_ID"] = job_id
    return env, dropped


def check_argv(argv: Sequence[str]) -> list[str]:
    if not argv:
        raise WorkloadError(
            "workload argv is empty (a program and its arguments are required; no shell is used)"
        )
    if not all(isinstance(a, str) for a in argv) or any("\0" in a for a in argv):
        raise WorkloadError("workload argv must be strings without NUL bytes")
    return list(argv)


def resolve_user(run_as: str | None) -> pwd.struct_passwd | None:
    """The account to run as, or None to run as the executor's own user."""
    if not run_as:
        return None
    try:
        entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    except KeyError:
        raise WorkloadError(f"run-as user {run_as!r} does not exist on this node") from None
    if entry.pw_uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        raise PermissionDeniedError(
            f"cannot run a workload as {run_as!r}: the executor runs as uid {os.geteuid()}, and switching "
            "users needs root. Run the executor as root or drop run_as from the job."
        )
    return entry


def log_path(log_dir: Path, job_id: str, serial: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:80]
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:8]
    return log_dir / f"{safe}-{digest}-{serial}.log"


def status_path(log: Path) -> Path:
    """Where the exit keeper records the status of the workload whose output goes to ``log``."""
    return log.with_suffix(".exit")


def take_status(path: Path) -> int | None:
    """The status the keeper recorded (then the file is removed), or None: not recorded (the keeper was killed,
    or the run predates keepers)."""
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    try:
        return int(raw)
    except ValueError:
        return None


def _check_program(job_id: str, program: str, search: str | None) -> None:
    """The errors the start would give, raised here: the keeper only writes them to the log."""
    found = shutil.which(program, mode=os.F_OK, path=search or os.defpath)
    if found is None:
        raise WorkloadError(f"job {job_id}: program {program!r} not found (argv is run without a shell)")
    if not os.access(found, os.X_OK):
        raise WorkloadError(f"job {job_id}: cannot execute {program!r}: Permission denied")


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def proc_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (guards against a recycled pid), or None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ProcessRun(Run):
    """A workload process this executor started (its child: the exit status is known)."""

    def __init__(
        self, instance: InstanceInfo, proc: asyncio.subprocess.Process, log: Path, keep_log: bool
    ) -> None:
        super().__init__(instance)
        self.proc = proc
        self.pid = proc.pid
        self.start_time = proc_start_time(proc.pid) or 0
        self.log = log
        self.gpu_uuid = ""
        """Set by the backend where the GPU index alone may not identify the GPU (adopted runs)."""
        self._keep_log = keep_log
        self._task = asyncio.get_running_loop().create_task(self._wait())

    async def _wait(self) -> None:
        status = await self.proc.wait()
        recorded = take_status(status_path(self.log))  # the workload's own status, not its keeper's exit code
        status = status if recorded is None else recorded
        tail = read_tail(self.log)
        if not self._keep_log:
            with contextlib.suppress(OSError):
                self.log.unlink()
        self._finish(RunResult(status=status, output_tail=tail))

    async def stop(self, grace_s: float) -> None:
        if self.done.done():
            return  # it ended on its own first: report it as it ended
        self.stopped = True
        _kill_group(self.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.done), timeout=grace_s)
        except TimeoutError:
            _kill_group(self.pid, signal.SIGKILL)

    def cancel(self) -> None:
        self._task.cancel()


class AdoptedRun(Run):
    """A workload a previous executor started: not our child, so we poll it, and learn its status from what its
    keeper recorded (unknown when the keeper was killed)."""

    def __init__(
        self, instance: InstanceInfo, pid: int, start_time: int, log: Path, poll_s: float, keep_log: bool = False
    ) -> None:
        super().__init__(instance)
        self.pid = pid
        self.start_time = start_time
        self.log = log
        self.gpu_uuid = ""
        self._keep_log = keep_log
        self._task = asyncio.get_running_loop().create_task(self._poll(poll_s))

    def alive(self) -> bool:
        return proc_start_time(self.pid) == self.start_time

    async def _poll(self, poll_s: float) -> None:
        while self.alive():
            await asyncio.sleep(poll_s)
        recorded = take_status(status_path(self.log))
        tail = read_tail(self.log)
        if not self._keep_log:  # as a run this executor started: the log goes once its tail is read
            with contextlib.suppress(OSError):
                self.log.unlink()
        if recorded is not None:
            self._finish(RunResult(status=recorded, output_tail=tail))
            return
        status = -int(signal.SIGTERM) if self.stopped else -1
        self._finish(RunResult(status=status, output_tail=tail, status_known=False))

    async def stop(self, grace_s: float) -> None:
        if self.done.done():
            return
        self.stopped = True
        if not self.alive():
            return  # gone already: the next poll reports it (as stopped: we cannot tell otherwise)
        _kill_group(self.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.done), timeout=grace_s)
        except TimeoutError:
            if self.alive():
                _kill_group(self.pid, signal.SIGKILL)

    def cancel(self) -> None:
        self._task.cancel()


async def launch(
    job_id: str,
    instance: InstanceInfo,
    spec: WorkloadSpec,
    *,
    log: Path,
    allowlist: Sequence[str],
    keep_log: bool = False,
    gang_env: Mapping[str, str] | None = None,
) -> tuple[ProcessRun, list[str]]:
    """Start ``spec.argv`` on ``instance`` (never through a shell); returns the run and dropped env names."""
    want = "GPU-" if instance.plain else "MIG-"
    if not all(u.startswith(want) for u in instance.uuid.split(",")):
        raise WorkloadError(
            f"instance GPU {instance.gpu_index} GI {instance.gi_id} has no {want[:-1]} device UUID yet"
        )
    argv = check_argv(spec.argv)
    user = resolve_user(spec.run_as)
    env, dropped = build_env(spec.env, allowlist=allowlist, mig_uuid=instance.uuid, job_id=job_id, gang_env=gang_env)
    account: list[str] = []  # the keeper switches to the user for the workload; it stays the executor's
    if user is not None:
        env["HOME"], env["USER"], env["LOGNAME"] = user.pw_dir, user.pw_name, user.pw_name
        groups = ",".join(str(g) for g in os.getgrouplist(user.pw_name, user.pw_gid))
        account = ["--user", str(user.pw_uid), "--group", str(user.pw_gid), "--groups", groups]
    _check_program(job_id, argv[0], env.get("PATH"))
    log.parent.mkdir(parents=True, exist_ok=True)
    status = status_path(log)
    status.write_bytes(b"")  # empty: not recorded yet
    with log.open("ab") as out:  # append: stdout and stderr share the file
        if user is not None:
            os.fchown(out.fileno(), user.pw_uid, user.pw_gid)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", str(KEEPER), str(status), *account, "--", *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:  # the program was checked above: this is the keeper's interpreter
            raise WorkloadError(f"job {job_id}: cannot start {sys.executable!r}: {exc.strerror}") from None
    return ProcessRun(instance, proc, log, keep_log), dropped


async def launch_group(
    job_id: str,
    instance: InstanceInfo,
    spec: WorkloadSpec,
    *,
    logs: Callable[[], Path],
    allowlist: Sequence[str],
    keep_log: bool = False,
    grace_s: float = 10.0,
) -> tuple[GroupRun, list[str]]:
    """A gang's part (``spec.procs``): one process per ``Proc``, each seeing only its GPUs (their ``GPU-`` UUIDs
    from the plain binding ``instance``, or its own MIG instance of ``spec.bindings``) and given its variables,
    as one ``GroupRun``. A process that cannot
    start stops those started before it."""
    uuids = dict(zip(instance.gpus, instance.uuid.split(","), strict=True)) if instance.plain else {}
    if spec.bindings and len(spec.bindings) != len(spec.procs):
        raise WorkloadError(f"job {job_id}: {len(spec.procs)} processes for {len(spec.bindings)} MIG instances")
    runs: list[Run] = []
    dropped: list[str] = []
    try:
        for n, proc in enumerate(spec.procs):
            part = spec.bindings[n] if spec.bindings else msgspec.structs.replace(
                instance, uuid=",".join(uuids[g] for g in proc.gpus), gpus=proc.gpus)
            run, dropped = await launch(job_id, part, spec, log=logs(), allowlist=allowlist, keep_log=keep_log,
                                        gang_env=proc_env(spec.env, proc))
            runs.append(run)
    except BaseException:
        await asyncio.gather(*(r.stop(0.0) for r in runs))
        raise
    return GroupRun(instance, runs, grace_s), dropped
