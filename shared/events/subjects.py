"""Subject and stream names (``Subjects``), per namespace, and which kind of message a subject carries."""

from __future__ import annotations

import re

from shared.events.envelope import DecodeError

_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


class Subjects:
    """Subject and stream names of one namespace. ``Subjects("")`` gives the plain names."""

    def __init__(self, namespace: str = "") -> None:
        if namespace and not _TOKEN.match(namespace):
            raise ValueError(f"namespace {namespace!r} must be one subject token ([A-Za-z0-9_-])")
        self.namespace = namespace
        self.root = f"{namespace}." if namespace else ""
        s = f"{namespace}_" if namespace else ""
        r = self.root
        self.jobs_submit = f"{r}jobs.submit"
        self.jobs_cancel = f"{r}jobs.cancel"
        self.jobs_exit = f"{r}jobs.exit"
        self.sched_placed = f"{r}sched.placed"
        self.sched_migrate = f"{r}sched.migrate"
        self.sched_capacity = f"{r}sched.capacity"
        self.sched_preempted = f"{r}sched.preempted"
        self.node_reports = f"{r}node.*.report"
        self.node_heartbeats = f"{r}node.*.heartbeat"
        self.stream_jobs, self.stream_sched = f"{s}JOBS", f"{s}SCHED"
        self.stream_cmd, self.stream_node, self.stream_dlq = f"{s}CMD", f"{s}NODE", f"{s}DLQ"

    def cmd(self, node: str) -> str:
        return f"{self.root}cmd.{node}"

    def node_report(self, node: str) -> str:
        return f"{self.root}node.{node}.report"

    def node_heartbeat(self, node: str) -> str:
        return f"{self.root}node.{node}.heartbeat"

    def dlq(self, subject: str) -> str:
        rel = subject[len(self.root) :] if self.root and subject.startswith(self.root) else subject
        return f"{self.root}dlq.{rel}"

    def streams(self) -> dict[str, list[str]]:
        """Stream name -> its subjects: one stream per concern."""
        r = self.root
        return {
            self.stream_jobs: [f"{r}jobs.>"],
            self.stream_sched: [f"{r}sched.>"],
            self.stream_cmd: [f"{r}cmd.>"],
            self.stream_node: [f"{r}node.>"],
            self.stream_dlq: [f"{r}dlq.>"],
        }

    def kind_of(self, subject: str) -> tuple[str, str | None]:
        """(kind, node or None); kind: submit|cancel|exit|placed|migrate|capacity|preempted|cmd|report|heartbeat."""
        if self.root:
            if not subject.startswith(self.root):
                raise DecodeError("subject outside this namespace", subject)
            subject = subject[len(self.root) :]
        parts = subject.split(".")
        if len(parts) == 2 and parts[0] == "jobs" and parts[1] in ("submit", "cancel", "exit"):
            return parts[1], None
        if len(parts) == 2 and parts[0] == "sched" and parts[1] in ("placed", "migrate", "capacity", "preempted"):
            return parts[1], None
        if len(parts) == 2 and parts[0] == "cmd":
            return "cmd", parts[1]
        if len(parts) == 3 and parts[0] == "node" and parts[2] in ("report", "heartbeat"):
            return parts[2], parts[1]
        raise DecodeError("unknown subject", subject)
