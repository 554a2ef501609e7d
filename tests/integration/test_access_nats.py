"""The shipped NATS config (deploy/nats/nats-server.conf) enforces the role table on a real nats-server.

A private server is started with exactly the checked-in file and random passwords in its environment, as the
compose stack runs it. A denial is observed through the client's error callback: the server answers a
forbidden PUB/SUB with ``-ERR 'Permissions Violation ...'`` before the PONG of a later PING, so after
``round_trip()`` the violation has been delivered (no sleeping).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, StreamConfig

from load.generator import Generator, JobFactory, steady
from load.recorder import Recorder
from shared import access
from shared.bus import JetStreamBus
from shared.bus.elections import advisory_subject
from shared.events import Demand, JobCancel, JobSubmit, Subjects
from shared.localservers import LocalServer, start_nats
from shared.settings import Settings, load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-server.conf"
STREAMS = Subjects("").streams()  # the stack's own stream layout (the plain names)


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[LocalServer, dict[str, str]]]:
    secrets = access.generate_secrets(access.DEFAULT_NODES)
    server = start_nats(config=CONFIG, env=secrets)  # passwords reach the server as compose passes them
    yield server, secrets
    server.stop()


async def round_trip(nc: Client) -> None:
    """Every command sent so far has been answered by the server. One flush is not enough: nats-py writes
    the flush's PING straight to the socket, ahead of publishes still in its pending buffer, so the first
    flush only guarantees they are written (its wait lets the flusher run), the second that they were
    answered."""
    await nc.flush()
    await nc.flush()


class Session:
    """One user's connection plus the permission violations the server reported to it."""

    def __init__(self, nc: Client, errors: asyncio.Queue[Exception]) -> None:
        self.nc, self.errors = nc, errors
        self.js = nc.jetstream(timeout=5)

    async def violation(self) -> str:
        await round_trip(self.nc)
        err = await asyncio.wait_for(self.errors.get(), 5)
        return str(err).lower()  # nats-py lower-cases the server's -ERR text

    async def no_violation(self) -> None:
        await round_trip(self.nc)
        assert self.errors.empty(), f"unexpected: {self.errors.get_nowait()}"


@pytest.fixture
async def login(secured: tuple[LocalServer, dict[str, str]]) -> AsyncIterator:
    server, secrets = secured
    opened: list[Client] = []

    async def connect(user: str) -> Session:
        errors: asyncio.Queue[Exception] = asyncio.Queue()

        async def on_error(e: Exception) -> None:
            await errors.put(e)

        var = next(u.env_var("nats") for u in access.users() if u.name == user)
        nc = await nats.connect(server.url, error_cb=on_error, allow_reconnect=False, connect_timeout=10,
                                **access.connect_options(user, secrets[var]))
        opened.append(nc)
        return Session(nc, errors)

    yield connect
    for nc in opened:
        await nc.close()


@pytest.fixture
async def admin(login) -> AsyncIterator[Session]:
    """Streams and node-b's executor consumer, provisioned by the admin user as the stack bootstrap does."""
    s = await login("admin")
    for name, subjects in STREAMS.items():
        await s.js.add_stream(StreamConfig(name=name, subjects=subjects))
    await s.js.add_consumer("CMD", ConsumerConfig(name="executor-node-b", durable_name="executor-node-b",
                                                  filter_subject="cmd.node-b", ack_policy="explicit"))
    yield s
    for name in STREAMS:
        await s.js.delete_stream(name)


async def test_the_publisher_can_submit_a_job_and_gets_a_jetstream_ack(login, admin: Session) -> None:
    pub = await login("publisher")
    ack = await pub.js.publish("jobs.submit", b'{"v":1,"id":"m1","job_id":"j-1"}')
    assert ack.stream == "JOBS"
    await pub.no_violation()


async def test_a_publisher_cannot_publish_commands_to_an_executor(login, admin: Session) -> None:
    pub = await login("publisher")
    await pub.nc.publish("cmd.node-a", b'{"op":"destroy-everything"}')
    assert 'permissions violation for publish to "cmd.node-a"' in await pub.violation()
    info = await admin.js.stream_info("CMD")
    assert info.state.messages == 0


async def test_a_publisher_cannot_read_other_publishers_jobs_or_replies(login, admin: Session) -> None:
    pub = await login("publisher")
    for subject in ("jobs.submit", "_INBOX.>", "_INBOX.balancer.>"):
        await pub.nc.subscribe(subject)
        assert f'permissions violation for subscription to "{subject.lower()}"' in await pub.violation()


async def test_an_executor_reads_its_own_commands_and_writes_its_own_reports(login, admin: Session) -> None:
    ex = await login("executor-node-a")
    sub = await ex.js.pull_subscribe("cmd.node-a", durable=access.durable_for("node-a"), stream="CMD")
    pub_admin_side = await login("registry")
    await pub_admin_side.js.publish("cmd.node-a", json.dumps({"job_id": "j-7"}).encode())
    [msg] = await sub.fetch(1, timeout=5)
    assert json.loads(msg.data)["job_id"] == "j-7"
    await msg.ack()
    for subject in ("node.node-a.report", "node.node-a.heartbeat", "dlq.cmd.node-a"):
        ack = await ex.js.publish(subject, b'{"v":1}')
        assert ack.seq >= 1
    await ex.no_violation()
    info = await admin.js.consumer_info("CMD", "executor-node-a")
    assert (info.delivered.stream_seq, info.num_ack_pending, info.num_pending) == (1, 0, 0)


async def test_an_executor_cannot_write_another_nodes_reports(login, admin: Session) -> None:
    ex = await login("executor-node-a")
    for subject in ("node.node-b.report", "node.node-b.heartbeat", "cmd.node-b", "sched.placed", "jobs.exit",
                    "dlq.cmd.node-b"):
        await ex.nc.publish(subject, b"{}")
        assert f'permissions violation for publish to "{subject.lower()}"' in await ex.violation()
    assert (await admin.js.stream_info("NODE")).state.messages == 0


async def test_an_executor_cannot_read_another_nodes_commands(login, admin: Session) -> None:
    part = await login("registry")
    await part.js.publish("cmd.node-b", b'{"job_id":"j-secret"}')
    ex = await login("executor-node-a")
    # core subscription to the subject, and to node-b's private inbox (where its fetched messages arrive)
    for subject in ("cmd.node-b", "cmd.*", "_INBOX.executor-node-b.>"):
        await ex.nc.subscribe(subject)
        assert f'permissions violation for subscription to "{subject.lower()}"' in await ex.violation()
    # pulling through node-b's durable: the fetch request itself is refused, nothing is delivered
    sub = await ex.js.pull_subscribe_bind("executor-node-b", stream="CMD")
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=1)
    assert '"$js.api.consumer.msg.next.cmd.executor-node-b"' in await ex.violation()
    # a consumer of its own that filters node-b's subject, the legacy create form, and a direct get
    for api in ("$JS.API.CONSUMER.CREATE.CMD.executor-node-a.cmd.node-b",
                "$JS.API.CONSUMER.DURABLE.CREATE.CMD.executor-node-a",
                "$JS.API.CONSUMER.CREATE.CMD", "$JS.API.STREAM.MSG.GET.CMD", "$JS.API.DIRECT.GET.CMD"):
        await ex.nc.publish(api, b"{}", reply="_INBOX.executor-node-a.x")
        assert f'permissions violation for publish to "{api.lower()}"' in await ex.violation()
    info = await admin.js.consumer_info("CMD", "executor-node-b")
    assert (info.num_pending, info.delivered.stream_seq) == (1, 0)


SERVICE_RULES = [
    ("balancer", "sched.placed", False), ("balancer", "cmd.node-a", True), ("balancer", "jobs.submit", False),
    ("balancer", "sched.capacity", False), ("balancer", "jobs.exit", False),
    ("registry", "cmd.node-a", True), ("registry", "jobs.exit", True),
    ("registry", "sched.capacity", True),
    ("registry", "sched.placed", False), ("registry", "jobs.submit", False),
    ("migration-planner", "sched.migrate", True), ("migration-planner", "cmd.node-a", False),
    ("audit", "jobs.submit", False), ("audit", "dlq.x", False), ("admin", "cmd.node-a", False),
    ("executor-node-b", "node.node-b.report", True), ("executor-node-b", "node.node-a.report", False),
    ("executor-node-b", "jobs.exit", False), ("executor-node-b", "node.node-b.heartbeat", True),
    ("publisher", "jobs.cancel", True), ("publisher", "jobs.exit", False),
]


@pytest.mark.parametrize(("user", "subject", "allowed"), SERVICE_RULES)
async def test_each_role_publishes_only_what_the_table_allows(login, admin: Session, user: str, subject: str,
                                                               allowed: bool) -> None:
    s = await login(user)
    await s.nc.publish(subject, b"{}")
    if allowed:
        await s.no_violation()
    else:
        assert f'permissions violation for publish to "{subject.lower()}"' in await s.violation()


@pytest.mark.parametrize(("user", "retired", "other"), [("registry", "partitioner-exit", "balancer-submit"),
                                                       ("migration-planner", "planner-exit", "balancer-submit")])
async def test_a_service_may_delete_the_consumer_its_older_version_left_and_no_other(
        login, admin: Session, user: str, retired: str, other: str) -> None:
    for name in (retired, other):
        await admin.js.add_consumer("JOBS", ConsumerConfig(durable_name=name, filter_subject="jobs.exit",
                                                           ack_policy="explicit"))
    s = await login(user)
    answer = json.loads((await s.nc.request(f"$JS.API.CONSUMER.DELETE.JOBS.{retired}", b"", timeout=5)).data)
    assert answer.get("success") is True
    await s.nc.publish(f"$JS.API.CONSUMER.DELETE.JOBS.{other}", b"")
    assert "permissions violation" in await s.violation()
    assert (await admin.js.consumer_info("JOBS", other)).name == other
    await admin.js.delete_consumer("JOBS", other)


async def test_the_audit_user_sees_the_pipeline_without_touching_it(login, admin: Session) -> None:
    audit = await login("audit")
    seen = await audit.nc.subscribe("cmd.>")
    await audit.no_violation()
    part = await login("registry")
    await part.nc.publish("cmd.node-a", b"c")
    await part.nc.flush()
    msg = await seen.next_msg(timeout=5)
    assert msg.subject == "cmd.node-a"


async def test_wrong_or_missing_credentials_are_refused(secured: tuple[LocalServer, dict[str, str]]) -> None:
    server, _ = secured
    for creds in ({"user": "admin", "password": "p" + "0" * 20}, {}):
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0,
                               connect_timeout=2, **creds)


def test_the_shipped_config_refuses_to_start_without_its_password_variables(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIGSCHED_NATS_")}
    env["MIGSCHED_NATS_STORE_DIR"] = str(tmp_path)
    binary = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/bin")
    out = subprocess.run([str(binary), "-t", "-c", str(CONFIG)], env=env, capture_output=True, text=True,
                         timeout=10, check=False)
    assert out.returncode != 0
    assert "MIGSCHED_NATS_PASSWORD_" in out.stdout + out.stderr


async def test_the_load_tools_need_no_more_than_the_publisher_and_audit_rights(login, admin: Session) -> None:
    pub, audit = await login("publisher"), await login("audit")
    balancer, registry, executor = await login("balancer"), await login("registry"), await login(
        "executor-node-a")
    rec = Recorder("acc", final="exit", skip=frozenset({"placed"}))  # the balancer sends the commands itself
    await rec.attach(audit.nc)  # core subscriptions on every stage's subject, as the audit user
    gen = Generator(pub.nc, Subjects(""), JobFactory("acc"), steady(1000, 0.05), on_submit=rec.submitted)
    stats = await gen.run()
    assert await gen.wait_acks(10) == 0 and stats.acked == 50
    for i in range(50):  # each stage published by the role that owns it
        await balancer.nc.publish("cmd.node-a",
                                     b'{"v":1,"id":"c%d","kind":"place","job_id":"acc-%d"}' % (i, i))
        await executor.nc.publish("node.node-a.report",
                                  b'{"v":1,"id":"r%d","kind":"job_started","job_id":"acc-%d"}' % (i, i))
        await registry.nc.publish("jobs.exit",
                                     b'{"v":1,"id":"x%d","kind":"completed","job_id":"acc-%d"}' % (i, i))
    assert await rec.wait_complete(10)
    assert rec.lost() == {"command": 0, "running": 0, "exit": 0}
    for s in (pub, audit, balancer, registry, executor):
        await s.no_violation()


async def test_a_bus_whose_url_names_a_user_takes_its_replies_on_that_users_inboxes(
    secured: tuple[LocalServer, dict[str, str]], admin: Session
) -> None:
    server, secrets = secured
    password = secrets[next(u.env_var("nats") for u in access.users() if u.name == "publisher")]
    host = server.url.split("://", 1)[1]
    settings = load(Settings, env={}, nats_url=f"nats://publisher:{quote(password, safe='')}@{host}")
    bus = await JetStreamBus.connect(settings)
    try:  # the JetStream acknowledgement comes back on _INBOX.publisher.>: nothing else is allowed
        ack = await bus.publish(bus.subjects.jobs_submit, JobSubmit(
            id="inbox-1", job_id="inbox-1", demand=Demand(profile="1g.5gb"), submitted_at=1.0))
        assert ack.stream == "JOBS"
    finally:
        await bus.close()


async def test_a_password_file_logs_in_the_user_the_url_names(
    secured: tuple[LocalServer, dict[str, str]], admin: Session, tmp_path: Path
) -> None:
    server, secrets = secured
    secret = tmp_path / "publisher"  # as a Secret mounted into the pod
    secret.write_text(secrets[next(u.env_var("nats") for u in access.users() if u.name == "publisher")] + "\n")
    host = server.url.split("://", 1)[1]
    settings = load(Settings, env={}, nats_url=f"nats://publisher@{host}", nats_password_file=str(secret))
    bus = await JetStreamBus.connect(settings)
    try:
        ack = await bus.publish(bus.subjects.jobs_submit, JobSubmit(
            id="file-1", job_id="file-1", demand=Demand(profile="1g.5gb"), submitted_at=1.0))
        assert ack.stream == "JOBS"
    finally:
        await bus.close()


@pytest.mark.parametrize(("user", "durable", "subject"), [
    ("balancer", "balancer-submit", "jobs.submit"),
    ("registry", "partitioner-cancel", "jobs.cancel"),
])
async def test_a_service_may_ask_who_leads_its_consumer_and_read_back_what_it_stored(
    secured: tuple[LocalServer, dict[str, str]], admin: Session, user: str, durable: str, subject: str
) -> None:
    server, secrets = secured
    host = server.url.split("://", 1)[1]

    def bus_of(name: str) -> Settings:
        password = secrets[next(u.env_var("nats") for u in access.users() if u.name == name)]
        return load(Settings, env={}, nats_url=f"nats://{name}:{quote(password, safe='')}@{host}")

    pub = await JetStreamBus.connect(bus_of("publisher"))
    bus = await JetStreamBus.connect(bus_of(user))
    try:
        c = bus.consumer("JOBS", durable, subject, lambda ds: asyncio.sleep(0))
        await c.start()
        msg = (JobSubmit(id="back-1", job_id="back-1", demand=Demand(profile="1g.5gb"), submitted_at=1.0)
               if subject == "jobs.submit" else JobCancel(id="back-2", job_id="back-2", at=1.0))
        ack = await pub.publish(subject, msg)
        lead = await bus.consumer_lead("JOBS", durable)
        assert lead is not None and lead.leader
        got = await bus.stored("JOBS", subject, 0.0, ack.seq, limit=10)
        assert [m.seq for m in got][-1] == ack.seq
        c.stop()
    finally:
        await bus.close()
        await pub.close()


@pytest.mark.parametrize(("user", "stream", "durable"), [
    ("balancer", "JOBS", "balancer-submit"),
    ("registry", "JOBS", "partitioner-cancel"),
])
async def test_a_service_may_watch_its_consumers_leader_elections_and_no_others(
    login, admin: Session, user: str, stream: str, durable: str
) -> None:
    svc = await login(user)
    await svc.nc.subscribe(advisory_subject(stream, durable))  # what ``shared.bus.elections`` counts
    await svc.no_violation()
    other = advisory_subject("CMD", access.durable_for("node-a"))  # a stream the service does not consume
    await svc.nc.subscribe(other)
    assert f'permissions violation for subscription to "{other.lower()}"' in await svc.violation()
