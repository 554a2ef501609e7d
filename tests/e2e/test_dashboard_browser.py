"""``migsched dashboard`` in a real headless browser against a running stack: the page shows a job just placed,
on its GPU and its slices, and answers nothing but GET."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from stack_fixture import running_stack, settings_of

from migsched.stack import Stack
from shared.bus import JetStreamBus
from shared.events import Demand, JobSubmit
from shared.localservers import free_port
from shared.state import JobRecord, RedisState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
ROOT = Path(__file__).resolve().parents[2]
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


async def _place(stack: Stack) -> JobRecord:
    st = settings_of(stack)
    await stack.wait_ready(60)
    bus = await JetStreamBus.connect(st)
    state = RedisState.from_settings(st)
    try:
        await bus.publish(bus.subjects.jobs_submit, JobSubmit(
            id="s-web", job_id="web-1", tenant="team-a", demand=Demand(profile="3g.20gb"), duration_hint_s=120.0,
            submitted_at=time.time()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            (rec,) = await state.jobs(["web-1"])
            if rec is not None and rec.state == "running":
                return rec
            await asyncio.sleep(0.1)
        raise AssertionError("the job did not start")
    finally:
        await state.close()
        await bus.close()


def _browse(url: str, *extra: str) -> str:
    assert BROWSER is not None
    out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=4000", *extra, url],
                         capture_output=True, text=True, timeout=90)
    return out.stdout


@pytest.mark.skipif(BROWSER is None, reason="no chromium here (Debian: apt-get install chromium; scripts/test.sh "
                                            "installs it when it runs as root)")
def test_the_dashboard_shows_a_job_just_placed_on_its_slices_in_a_browser(
    prefix: str, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    with running_stack(prefix, nats_url, redis_url, tmp_path, executors=1, gpus="A100-40GB:2") as stack:
        rec = asyncio.run(_place(stack))
        web = subprocess.Popen(
            [sys.executable, "-m", "migsched", "dashboard", "--port", str(port), "--namespace", prefix,
             "--redis-url", redis_url, "--nats-url", nats_url],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = f"http://127.0.0.1:{port}/"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if b'"web-1"' in urllib.request.urlopen(url + "api/view", timeout=2).read():
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the dashboard never served the job"
                time.sleep(0.2)
            dom = _browse(url, "--dump-dom")
            shot = Path(os.environ.get("MIGSCHED_DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
            _browse(url, f"--screenshot={shot}", "--window-size=1400,700")
            # read-only: anything but GET is refused
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url + "api/view", data=b"{}", method="POST"), timeout=5)
            assert refused.value.code == 405
        finally:
            web.terminate()
            web.wait(10)
    row = re.search(rf'<div class="gpu[^"]*" data-gpu="{re.escape(rec.gpu)}">(.*?)</div></div></div>', dom, re.S)
    assert row is not None, dom[:3000]
    cell = re.search(r'<div class="slice (\w+)" data-job="web-1" data-profile="3g.20gb" data-start="(\d)"',
                     row.group(1))
    assert cell is not None, row.group(1)
    start = int(rec.inst.split("@", 1)[1].split(":", 1)[0])  # the instance id says where it starts
    assert cell.group(1) == "busy" and int(cell.group(2)) == start
    assert "Lazy" in row.group(1) or "Busy" in row.group(1)
    assert shot.exists() and shot.stat().st_size > 10_000
