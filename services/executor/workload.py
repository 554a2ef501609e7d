"""Running workloads, shared by both backends: the job table, exit reporting and make-before-break moves.

A backend turns a ``WorkloadSpec`` into a ``Run`` (the sim backend: a timer; the nvml backend: a process, see
``process.py``); ``JobTable`` owns the runs, watches each one and reports exits through ``next_exit()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

import msgspec

from services.executor.backend import BusyInstanceError, InstanceInfo, WorkloadError, WorkloadExit


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    output_tail: str = ""
    status_known: bool = True


class Run:
    """One running copy of a workload on one instance. ``done`` resolves once, when it has ended."""

    def __init__(self, instance: InstanceInfo) -> None:
        self.instance = instance
        self.started_by = ""
        """The command that started it (``WorkloadSpec.started_by``, set by the backend that starts or adopts
        it; '' when not known): its exit names it."""
        self.stopped = False
        """Set by ``stop()``: the exit is reported with reason ``stopped``."""
        self.done: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()

    def _finish(self, result: RunResult) -> None:
        if not self.done.done():
            self.done.set_result(result)

    async def wait(self) -> RunResult:
        return await asyncio.shield(self.done)

    async def stop(self, grace_s: float) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        """Forget the run without touching what it runs (backend shutdown)."""


class SleepRun(Run):
    """The sim backend's workload: "runs" for ``duration_s`` (forever when None) then exits 0."""

    def __init__(self, instance: InstanceInfo, duration_s: float | None) -> None:
        super().__init__(instance)
        self._task = asyncio.get_running_loop().create_task(self._run(duration_s))

    async def _run(self, duration_s: float | None) -> None:
        if duration_s is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(max(0.0, duration_s))
        self._finish(RunResult(status=0))

    async def stop(self, grace_s: float) -> None:
        if self.done.done():
            return  # it ended on its own first: report it as it ended
        self.stopped = True
        self._task.cancel()
        self._finish(RunResult(status=-15))

    def cancel(self) -> None:
        self._task.cancel()


class GroupRun(Run):
    """A gang's part started per GPU: several processes, one run. It ends once every process has ended; the
    first one that fails stops the others, and its status (and output) is the run's."""

    def __init__(self, instance: InstanceInfo, runs: list[Run], grace_s: float) -> None:
        super().__init__(instance)
        self.runs = runs
        self._task = asyncio.get_running_loop().create_task(self._watch(grace_s))

    async def _watch(self, grace_s: float) -> None:
        waits = {asyncio.ensure_future(r.wait()): r for r in self.runs}
        failed: RunResult | None = None
        last = RunResult(status=0)
        while waits:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                del waits[f]
                last = f.result()
                if last.status != 0 and failed is None:
                    failed = last
                    await asyncio.gather(*(r.stop(grace_s) for r in waits.values()))
        self._finish(failed or last)

    async def stop(self, grace_s: float) -> None:
        if self.done.done():
            return
        self.stopped = True
        await asyncio.gather(*(r.stop(grace_s) for r in self.runs))

    def cancel(self) -> None:
        for r in self.runs:
            r.cancel()
        self._task.cancel()


def _reason(run: Run, result: RunResult) -> str:
    if run.stopped:
        return "stopped"
    if not result.status_known:
        return "lost"
    return "completed" if result.status == 0 else "failed"


class JobTable:
    """Job id -> its current run. Exits of runs that were replaced (moved) are never reported.

    Every question a command or an exit asks per job is answered without a pass over the runs: ``running()`` is
    a live view of a maintained job -> instance map, and an index (GPU, GI id) -> job answers ``job_on`` and
    ``jobs_on``. All of them change together: in ``_set`` (add, move), ``_drop`` (an end) and ``close`` only.
    """

    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._runs: dict[str, Run] = {}
        self._instances: dict[str, InstanceInfo] = {}
        """Job -> its run's instance, in the order of ``_runs`` (a scan of either meets the jobs alike)."""
        self._view: Mapping[str, InstanceInfo] = MappingProxyType(self._instances)
        self._by_gpu: dict[int, dict[int, str]] = {}
        """GPU index -> GI id -> the job running there: the first one in ``_runs`` order, as a scan finds it."""
        self._crowded: dict[tuple[int, int], int] = {}
        """(GPU, GI id) -> runs there beyond the first. Never from a start or a move (both refuse a busy
        instance); only an adoption of a state file listing two jobs on one instance could."""
        self._watchers: set[asyncio.Task[None]] = set()
        self._exits: asyncio.Queue[WorkloadExit] = asyncio.Queue()
        self._on_change = on_change or (lambda: None)

    def running(self) -> Mapping[str, InstanceInfo]:
        """Job id -> the instance it runs on: a read-only LIVE view, which changes as runs start, move and end.
        A caller that keeps it across an ``await``, or iterates it while runs may change, takes a copy."""
        return self._view

    def runs(self) -> dict[str, Run]:
        return dict(self._runs)

    def get(self, job_id: str) -> Run | None:
        return self._runs.get(job_id)

    def job_on(self, gpu_index: int, gi_id: int) -> str | None:
        """The job running on the instance (the first one started there, should several be), or None."""
        gis = self._by_gpu.get(gpu_index)
        return None if gis is None else gis.get(gi_id)

    def jobs_on(self, gpu_index: int) -> Mapping[int, str]:
        """GI id -> the job running on it, for one GPU: a read-only live view, like ``running()``."""
        gis = self._by_gpu.get(gpu_index)
        if gis is None:  # kept from now on (one small dict per GPU asked about), so the view stays live
            gis = self._by_gpu[gpu_index] = {}
        return MappingProxyType(gis)

    # ---- the one place the maps change ----

    def _set(self, job_id: str, run: Run) -> None:
        """Add the job's run, or replace its current one (in place: the job keeps its position)."""
        old = self._runs.get(job_id)
        self._runs[job_id] = run
        self._instances[job_id] = run.instance
        if old is not None:
            self._unindex(old.instance)
        self._index(job_id, run.instance)

    def _drop(self, job_id: str) -> None:
        run = self._runs.pop(job_id)
        del self._instances[job_id]
        self._unindex(run.instance)

    def _index(self, job_id: str, instance: InstanceInfo) -> None:
        gis = self._by_gpu.get(instance.gpu_index)
        if gis is None:
            gis = self._by_gpu[instance.gpu_index] = {}
        if instance.gi_id not in gis:
            gis[instance.gi_id] = job_id
            return
        slot = (instance.gpu_index, instance.gi_id)
        self._crowded[slot] = self._crowded.get(slot, 0) + 1
        gis[instance.gi_id] = self._first_on(slot)

    def _unindex(self, instance: InstanceInfo) -> None:
        """Called once the run is gone from ``_runs`` (or replaced there)."""
        gis = self._by_gpu[instance.gpu_index]
        slot = (instance.gpu_index, instance.gi_id)
        extra = self._crowded.get(slot)
        if extra is None:
            del gis[instance.gi_id]
            return
        if extra == 1:
            del self._crowded[slot]
        else:
            self._crowded[slot] = extra - 1
        gis[instance.gi_id] = self._first_on(slot)

    def _first_on(self, slot: tuple[int, int]) -> str:
        return next(job for job, i in self._instances.items() if (i.gpu_index, i.gi_id) == slot)

    def check_can_start(self, job_id: str, instance: InstanceInfo) -> bool:
        """True when the job already runs on this instance (a redelivered command: do nothing)."""
        current = self._runs.get(job_id)
        if current is not None:
            same = (current.instance.gpu_index, current.instance.gi_id) == (
                instance.gpu_index,
                instance.gi_id,
            )
            if same:
                return True
            raise WorkloadError(
                f"job {job_id} already runs on GPU {current.instance.gpu_index} "
                f"GI {current.instance.gi_id}; move it instead"
            )
        other = self.job_on(instance.gpu_index, instance.gi_id)
        if other is not None:
            raise BusyInstanceError(f"GPU {instance.gpu_index} GI {instance.gi_id} is busy with job {other}")
        return False

    def add(self, job_id: str, run: Run) -> None:
        self._set(job_id, run)
        self._watch(job_id, run)
        self._on_change()

    def _watch(self, job_id: str, run: Run) -> None:
        task = asyncio.get_running_loop().create_task(self._report(job_id, run))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _report(self, job_id: str, run: Run) -> None:
        self._ended(job_id, run, await run.wait())

    def _ended(self, job_id: str, run: Run, result: RunResult) -> None:
        """Forget the run and queue its exit, once (its watcher and ``stop`` may both get here)."""
        if self._runs.get(job_id) is not run:
            return  # replaced by a move (the job did not end), or reported already
        self._drop(job_id)
        self._on_change()
        self._exits.put_nowait(
            WorkloadExit(
                job_id=job_id,
                status=result.status,
                reason=_reason(run, result),
                output_tail=result.output_tail,
                status_known=result.status_known,
                instance=run.instance,
                started_by=run.started_by,
            )
        )

    async def stop(self, job_id: str, grace_s: float) -> None:
        """Stop a job and wait until it is gone, from ``running()`` too: a registration right after must not
        list it (the watcher would drop it only when next scheduled). Unknown jobs are a no-op (commands are
        redelivered)."""
        run = self._runs.get(job_id)
        if run is None:
            return
        await run.stop(grace_s)
        self._ended(job_id, run, await run.wait())

    async def next_exit(self) -> WorkloadExit:
        return await self._exits.get()

    def exits_ready(self, limit: int) -> list[WorkloadExit]:
        """Up to ``limit`` exits already queued, without waiting."""
        out: list[WorkloadExit] = []
        while len(out) < limit and not self._exits.empty():
            out.append(self._exits.get_nowait())
        return out

    async def move(
        self, job_id: str, start_target: Callable[[], Awaitable[Run]], *, confirm_s: float, grace_s: float
    ) -> None:
        """Make before break: start the target copy, see it survive ``confirm_s``, then retire the source."""
        source = self._runs.get(job_id)
        if source is None:
            raise WorkloadError(f"cannot move job {job_id}: it is not running on this node")
        target = await start_target()
        try:
            result = await asyncio.wait_for(target.wait(), timeout=max(confirm_s, 0.0))
        except TimeoutError:
            pass
        else:
            raise WorkloadError(
                f"move of job {job_id} aborted: the target copy on GPU {target.instance.gpu_index} "
                f"GI {target.instance.gi_id} exited with status {result.status} during confirmation; "
                f"the source keeps running. Output: {result.output_tail[-500:]!r}"
            )
        if self._runs.get(job_id) is not source:  # the source ended (or was stopped) meanwhile
            await target.stop(grace_s)
            await target.wait()
            raise WorkloadError(f"move of job {job_id} aborted: the source copy ended during the move")
        self._set(job_id, target)
        self._watch(job_id, target)
        self._on_change()
        await source.stop(grace_s)
        await source.wait()

    async def close(self) -> None:
        """Stop watching; runs are forgotten, not stopped (a restarted executor adopts real processes)."""
        for run in self._runs.values():
            run.cancel()
        for task in list(self._watchers):
            task.cancel()
        for task in list(self._watchers):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._runs.clear()
        self._instances.clear()
        for gis in self._by_gpu.values():  # emptied, not dropped: the views handed out stay live
            gis.clear()
        self._crowded.clear()
