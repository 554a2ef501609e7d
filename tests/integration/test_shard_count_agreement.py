"""Every process of a deployment runs the same shard count, on real NATS + Redis: a scheduling service started with
another count than the namespace's exits at once with the reason and makes nothing, and the command line reads the
recorded count, so ``migsched status`` shows every shard without ``MIGSCHED_SHARDS`` set."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from nats.js.errors import NotFoundError

from migsched.cli import main
from services.common.testing import make_settings, private_state
from shared.bus import JetStreamBus
from shared.client import MigschedClient
from shared.events import encode
from shared.state.deployment import recorded_shards
from shared.state.sharding import shard_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


async def test_a_service_of_another_shard_count_exits_with_the_reason_and_makes_nothing(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as deployment:
        await deployment.claim_shards()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIGSCHED_")}
        env.update({"MIGSCHED_NATS_URL": nats_url, "MIGSCHED_REDIS_URL": redis_url, "MIGSCHED_NAMESPACE": prefix,
                    "MIGSCHED_SHARDS": "1", "MIGSCHED_METRICS_PORT": "0", "PYTHONPATH": str(REPO)})
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "services.registry"], env=env,
                                       cwd=REPO, capture_output=True, text=True, timeout=90)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert f"registry cannot start: MIGSCHED_SHARDS=1, but namespace {prefix!r} runs 2 shard(s)" in out
        assert "Traceback" not in out
        bus = await JetStreamBus.connect(make_settings(prefix, nats_url, redis_url))
        try:
            with pytest.raises(NotFoundError):  # refused before it set up the namespace's streams
                await bus.js.stream_info(bus.subjects.stream_jobs)
        finally:
            await bus.close()
        assert await recorded_shards(deployment.redis, prefix) == 2


def cli(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), env=env)
    return r.exit_code, r.output


async def test_status_reads_every_shard_of_the_deployment_without_being_told_the_count(
    prefix: str, nats_url: str, redis_url: str
) -> None:
    async with private_state(prefix, nats_url, redis_url, shards=2) as deployment:
        await deployment.claim_shards()
        now = time.time()
        far = next(f"job-{i}" for i in range(100) if shard_of(f"job-{i}", 2) == 1)
        spec = encode(MigschedClient.job(job_id=far, profile="1g.5gb"))
        await deployment.enqueue(far, spec, 0, now, "no room", now)
        where = ["--redis-url", redis_url, "--namespace", prefix]
        code, out = await asyncio.to_thread(cli, "status", "--json", *where, env={"MIGSCHED_SHARDS": None})
        assert code == 0, out
        assert json.loads(out)["jobs"] == {far: "pending"}
        code, out = await asyncio.to_thread(cli, "describe", far, *where, env={"MIGSCHED_SHARDS": None})
        assert code == 0 and far in out, out
        code, out = await asyncio.to_thread(cli, "status", *where, env={"MIGSCHED_SHARDS": "3"})
        assert code == 2, out
        assert out.strip() == (f"error: MIGSCHED_SHARDS=3, but namespace {prefix!r} runs 2 shard(s): every process "
                               "of a deployment must use the same count (jobs and nodes are found by it); set "
                               "MIGSCHED_SHARDS=2, or use another namespace, or an empty one, for 3")
        code, out = await asyncio.to_thread(cli, "check", *where, "--shards", "3")
        assert code == 2 and "runs 2 shard(s)" in out, out
