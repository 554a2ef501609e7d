"""Workload processes: bound to their MIG device, argv only, allowlisted environment, output tail, run-as."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.executor import process
from services.executor.backend import (
    InstanceInfo,
    PermissionDeniedError,
    WorkloadError,
    WorkloadExit,
    WorkloadSpec,
)
from services.executor.nvml_backend import NvmlBackend
from services.executor.nvml_fake import FakeGpu, FakeNvml
from services.executor.process import TAIL_BYTES, build_env

pytestmark = pytest.mark.unit

PY = sys.executable


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[NvmlBackend, InstanceInfo]]:
    b = NvmlBackend(
        node="n1",
        nvml=FakeNvml([FakeGpu("A100-40GB")]),
        state_dir=tmp_path,
        env_allowlist=("PATH", "LANG", "LC_*"),
        stop_grace_s=5.0,
    )
    inst = await b.create_instance(0, 9, 4)
    yield b, inst
    for job in list(b.running()):
        await b.stop_workload(job)
    await b.close()


async def run(b: NvmlBackend, inst: InstanceInfo, code: str, *args: str, **spec: object) -> WorkloadExit:
    await b.start_workload("w", inst, WorkloadSpec(argv=(PY, "-c", code, *args), **spec))  # type: ignore[arg-type]
    return await asyncio.wait_for(b.next_exit(), 20)


async def test_the_workload_sees_only_its_mig_device_and_allowlisted_variables(
    node: tuple[NvmlBackend, InstanceInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, inst = node
    monkeypatch.setenv("MIGSCHED_TEST_LEAK", "executor secret")
    monkeypatch.setenv("LC_TIME", "C")
    env = {"LANG": "C.UTF-8", "SECRET_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "0"}
    done = await run(b, inst, "import json, os; print(json.dumps(dict(os.environ)))", env=env)
    seen = json.loads(done.output_tail)
    assert seen["CUDA_VISIBLE_DEVICES"] == inst.uuid
    assert seen["MIGSCHED_JOB_ID"] == "w"
    assert seen["LANG"] == "C.UTF-8" and seen["LC_TIME"] == "C"
    assert "SECRET_TOKEN" not in seen and "MIGSCHED_TEST_LEAK" not in seen and "HOME" not in seen


async def test_argv_reaches_the_program_verbatim_without_a_shell(
    node: tuple[NvmlBackend, InstanceInfo],
) -> None:
    b, inst = node
    tricky = ("$(echo pwned)", "a; rm -rf /", "*", "'quoted'")
    done = await run(b, inst, "import sys, json; print(json.dumps(sys.argv[1:]))", *tricky)
    assert json.loads(done.output_tail) == list(tricky)


async def test_the_exit_status_and_the_last_bytes_of_output_are_reported(
    node: tuple[NvmlBackend, InstanceInfo],
) -> None:
    b, inst = node
    done = await run(
        b, inst, "import sys; print('x' * 20000, flush=True); print('THE END', file=sys.stderr); sys.exit(7)"
    )
    assert (done.status, done.reason) == (7, "failed")
    assert len(done.output_tail.encode()) <= TAIL_BYTES
    assert done.output_tail.endswith("THE END\n")


async def test_a_program_that_does_not_exist_is_a_workload_error(
    node: tuple[NvmlBackend, InstanceInfo],
) -> None:
    b, inst = node
    with pytest.raises(WorkloadError, match="not found"):
        await b.start_workload("w", inst, WorkloadSpec(argv=("/nonexistent/trainer", "--x")))
    with pytest.raises(WorkloadError, match="empty"):
        await b.start_workload("w", inst, WorkloadSpec(argv=()))
    assert not b.running()


async def test_running_as_another_user_without_root_is_refused_clearly(
    node: tuple[NvmlBackend, InstanceInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, inst = node
    monkeypatch.setattr(process.os, "geteuid", lambda: 54321)  # an unprivileged executor
    with pytest.raises(PermissionDeniedError, match="needs root"):
        await b.start_workload("w", inst, WorkloadSpec(argv=(PY, "-c", "pass"), run_as="root"))
    with pytest.raises(WorkloadError, match="does not exist"):
        await b.start_workload("w", inst, WorkloadSpec(argv=(PY, "-c", "pass"), run_as="no-such-user-x"))


async def test_stopping_reaches_the_workloads_children(
    node: tuple[NvmlBackend, InstanceInfo], tmp_path: Path
) -> None:
    b, inst = node
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)\n"
    )
    await b.start_workload("w", inst, WorkloadSpec(argv=(PY, "-c", code)))
    for _ in range(500):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.02)
    child = int(pidfile.read_text())
    await b.stop_workload("w")
    assert (await asyncio.wait_for(b.next_exit(), 20)).reason == "stopped"
    for _ in range(500):  # the grandchild got the group's SIGTERM too
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the workload's child survived the stop")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_as_root_a_workload_runs_as_the_requested_user(node: tuple[NvmlBackend, InstanceInfo]) -> None:
    b, inst = node
    nobody = pwd.getpwnam("nobody")
    await b.start_workload("w", inst, WorkloadSpec(argv=("/usr/bin/id", "-u"), run_as="nobody"))
    done = await asyncio.wait_for(b.next_exit(), 20)
    assert (done.status, done.output_tail.strip()) == (0, str(nobody.pw_uid))


def test_the_allowlist_takes_shell_style_patterns_and_protects_the_device_binding() -> None:
    env, dropped = build_env(
        {"LC_ALL": "C", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "GPU-other", "EVIL": "1"},
        allowlist=("PATH", "LC_*", "NCCL_*", "CUDA_VISIBLE_DEVICES"),
        mig_uuid="MIG-abc",
        job_id="j",
        base={"PATH": "/usr/bin", "HOME": "/root", "NCCL_SOCKET": "eth0"},
    )
    assert env == {
        "PATH": "/usr/bin",
        "NCCL_SOCKET": "eth0",
        "LC_ALL": "C",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "MIG-abc",
        "MIGSCHED_JOB_ID": "j",
    }
    assert dropped == ["CUDA_VISIBLE_DEVICES", "EVIL"]
