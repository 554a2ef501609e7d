"""The OTLP exporter's output is valid OTLP: an executor process with ``MIGSCHED_OTLP_ENDPOINT`` pointing at
a tiny local HTTP collector exports its spans there; every request body decodes as an
``ExportTraceServiceRequest``
and
the command's span continues the trace whose ``traceparent`` the command carried in its NATS headers.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from shared.bus import JetStreamBus
from shared.events import CmdDone, Command, Subjects, decode, encode, now
from shared.localservers import free_port
from shared.mig.geometry import default_geometry
from shared.policy.partition import MigOp
from shared.settings import Settings, load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
REPO = Path(__file__).resolve().parents[2]
NODE = "otlp-node"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Collector:
    """Records every POST to /v1/traces (content type, body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                outer.requests.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    yield c
    c.server.shutdown()


async def _place_and_wait(settings: Settings) -> None:
    bus = await JetStreamBus.connect(settings)
    try:
        await bus.ensure_streams()
        got: asyncio.Future[CmdDone] = asyncio.get_running_loop().create_future()
        subjects = Subjects(settings.namespace)

        async def on_report(m: object) -> None:
            r = decode(m.subject, m.data, subjects)  # type: ignore[attr-defined]
            if isinstance(r, CmdDone) and not got.done():
                got.set_result(r)

        sub = await bus.nc.subscribe(subjects.node_report(NODE), cb=on_report)
        p = default_geometry().model("A100-40GB").profile("1g.5gb")
        iid = f"{NODE}/0:1g.5gb@0:otlp-job"
        ops = tuple(
            MigOp(
                kind=k,
                gpu_id=f"{NODE}/0",
                instance_id=iid,
                profile=p.name,
                profile_id=p.profile_id,
                start=0,
                size=1,
            )
            for k in ("create_gi", "create_ci")
        )
        cmd = Command(
            id="otlp-c1",
            cmd_id="otlp-c1",
            kind="place",
            node=NODE,
            gpu_id=f"{NODE}/0",
            gpu_index=0,
            ops=ops,
            instance_id=iid,
            job_id="otlp-job",
            duration_s=0.05,
            at=now(),
        )
        # the executor may still be starting: its durable consumer delivers the stored command once it is up
        await bus.js.publish(
            subjects.cmd(NODE),
            encode(cmd),
            headers={"Nats-Msg-Id": cmd.id, "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
        )
        await asyncio.wait_for(got, 30)
        await sub.unsubscribe()
        await asyncio.sleep(0.3)  # the job's exit span
    finally:
        await bus.delete_streams()
        await bus.close()


def test_an_executor_exports_valid_otlp_that_continues_the_commands_trace(
    collector: Collector, nats_url: str, prefix: str
) -> None:
    settings = load(Settings, env={}, nats_url=nats_url, namespace=prefix, stream_storage="memory")
    env = {
        **os.environ,
        "MIGSCHED_NATS_URL": nats_url,
        "MIGSCHED_NAMESPACE": prefix,
        "MIGSCHED_NODE": NODE,
        "MIGSCHED_STREAM_STORAGE": "memory",
        "MIGSCHED_EXECUTOR_GPUS": "A100-40GB:1",
        "MIGSCHED_METRICS_PORT": "0",
        "MIGSCHED_EXECUTOR_RECONFIG_LATENCY_S": "0.001",
        "MIGSCHED_OTLP_ENDPOINT": collector.url,
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.executor"],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        asyncio.run(_place_and_wait(settings))
    finally:
        proc.send_signal(signal.SIGTERM)  # a clean stop flushes the batch span processor
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    assert collector.requests, "no OTLP request reached the collector"
    spans = []
    for path, ctype, body in collector.requests:
        assert path == "/v1/traces" and ctype == "application/x-protobuf"
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)  # raises on anything that is not OTLP protobuf
        assert req.resource_spans
        for rs in req.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            assert attrs["service.name"] == f"migsched-executor-{NODE}"
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    place = [s for s in spans if s.name == "executor place"]
    assert len(place) == 1
    assert place[0].trace_id.hex() == TRACE_ID and len(place[0].span_id) == 8
    assert place[0].start_time_unix_nano <= place[0].end_time_unix_nano
    assert any(s.name == "executor job exit" and s.trace_id.hex() == TRACE_ID for s in spans)


def test_the_cli_submit_starts_the_jobs_trace_and_exports_its_span(
    collector: Collector, prefix: str, nats_url: str
) -> None:
    env = {**os.environ, "MIGSCHED_OTLP_ENDPOINT": collector.url, "MIGSCHED_NAMESPACE": prefix,
           "MIGSCHED_NATS_URL": nats_url}
    out = subprocess.run(
        [sys.executable, "-m", "migsched", "submit", "--profile", "1g.5gb", "--job-id", "cli-traced", "--anyway"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    spans = [s for _, _, body in collector.requests
             for rs in ExportTraceServiceRequest.FromString(body).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    submit = [s for s in spans if s.name == "submit"
              and any(a.key == "migsched.job_id" and a.value.string_value == "cli-traced" for a in s.attributes)]
    assert len(submit) == 1 and not submit[0].parent_span_id  # the root of the job's trace

    async def stored_traceparent() -> str:
        settings = load(Settings, env={}, nats_url=nats_url, namespace=prefix)
        bus = await JetStreamBus.connect(settings)
        try:
            msg = await bus.js.get_last_msg(bus.subjects.stream_jobs, bus.subjects.jobs_submit)
            return (msg.headers or {}).get("traceparent", "")
        finally:
            await bus.delete_streams()  # the submit (--anyway) created them on a server other tests share
            await bus.close()

    tp = asyncio.run(stored_traceparent())
    assert tp.split("-")[1:3] == [submit[0].trace_id.hex(), submit[0].span_id.hex()]
