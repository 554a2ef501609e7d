"""The NVML executor's small on-disk memory: which instances it created and which jobs it started.

A restarted executor reads it to adopt its own instances and running jobs instead of destroying them, and to
tell its instances from foreign ones (made by an operator or another tool), which it never destroys unless
configured to. GPUs are keyed by UUID because indices can change across reboots. Written atomically
(temp file + rename) after every change.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from services.executor.backend import BackendUnavailableError, InstanceInfo


class OwnedInstance(msgspec.Struct, frozen=True, kw_only=True):
    gpu_uuid: str
    gi_id: int
    profile_id: int
    start: int


class PartProcess(msgspec.Struct, frozen=True, kw_only=True):
    """One more process of a gang's part started per GPU (the first is the record's own ``pid``)."""

    instance: InstanceInfo
    pid: int
    start_time: int
    log: str
    gpu_uuid: str = ""
    """Its GPU (a gang on MIG GPUs has a member on each); '' for the record's own."""


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    job_id: str
    gpu_uuid: str
    instance: InstanceInfo
    pid: int
    start_time: int
    """Kernel start time of ``pid``: a recycled pid is never mistaken for the job."""
    log: str
    more: list[PartProcess] = []
    """A gang's part started per GPU: its other processes, adopted together as one run."""
    started_by: str = ""
    """The command that started the run: an adopted run's exit still names it."""


class StateFile(msgspec.Struct, kw_only=True):
    v: int = 1
    node: str = ""
    instances: list[OwnedInstance] = []
    jobs: list[JobRecord] = []


class StateStore:
    def __init__(self, state_dir: str | Path, node: str) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / f"nvml-{node}.json"
        self.log_dir = self.dir / "logs"
        self.node = node

    def ensure(self) -> None:
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise BackendUnavailableError(
                f"executor state dir {self.dir} is not writable ({exc.strerror}); set "
                "MIGSCHED_EXECUTOR_STATE_DIR to a directory the executor owns"
            ) from exc

    def load(self) -> StateFile:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return StateFile(node=self.node)
        try:
            return msgspec.json.decode(raw, type=StateFile)
        except (msgspec.DecodeError, msgspec.ValidationError):
            # keep the evidence and start clean: nothing is destroyed over a bad file (all GIs are foreign)
            self.path.rename(self.path.with_suffix(".corrupt"))
            return StateFile(node=self.node)

    def save(self, state: StateFile) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(state))
        os.replace(tmp, self.path)
