"""Run one service as a process: logging, tracing, metrics, uvloop, SIGTERM/SIGINT -> graceful stop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

from services.common import health, stalls
from shared import telemetry
from shared.settings import SettingsError, load
from shared.state.deployment import ShardCountMismatch


def run(service_cls: Any, settings_cls: Any, **overrides: Any) -> None:
    """Run the service until SIGTERM/SIGINT. A setting that cannot work (a malformed value, a shard count other
    than the deployment's) is one error line and exit status 2, not a traceback: restarting cannot fix it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    log = logging.getLogger(f"migsched.{service_cls.name}")
    try:
        settings = load(settings_cls, **overrides)
        logging.getLogger().setLevel(settings.log_level.upper())
        try:
            import uvloop

            uvloop.install()
        except ImportError:  # optional speed-up
            pass
        run_profiled(service_cls.name, lambda: _main(service_cls, settings))
    except (SettingsError, ShardCountMismatch) as exc:
        log.error("%s cannot start: %s", service_cls.name, exc)
        raise SystemExit(2) from None


def tune_gc() -> None:
    """Freeze what start-up made (modules, geometry tables, settings) out of the collector's sight and collect
    the youngest generation less often. A service allocates a few short-lived objects per message; with the
    default thresholds its full collections walked every start-up object as well, 40 ms pauses in the
    balancer and registry, each one a spike in submit -> command latency."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


GC_GEN0_THRESHOLD = 10_000


def run_profiled(name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``asyncio.run(main())`` with its pauses watched (``stalls``); with ``MIGSCHED_PROFILE=<dir>`` under a
    cProfile of the whole run, written to ``<dir>/<name>-<pid>.prof`` at a graceful stop (where the time
    goes)."""
    tune_gc()
    stalls.GcPauses(name).install()
    profile = os.environ.get("MIGSCHED_PROFILE", "")
    if not profile:
        asyncio.run(watched(name, main))
        return
    import cProfile

    prof = cProfile.Profile(time.process_time)  # CPU time: a shared machine descheduling us is not our cost
    prof.enable()
    try:
        asyncio.run(watched(name, main))
    finally:
        prof.disable()
        os.makedirs(profile, exist_ok=True)
        prof.dump_stats(os.path.join(profile, f"{name}-{os.getpid()}.prof"))


async def watched(name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``main()`` beside a watch of the event loop's stalls, which ends with it."""
    watch = asyncio.create_task(stalls.watch_loop(name))
    try:
        await main()
    finally:
        watch.cancel()


async def _main(service_cls: Any, settings: Any) -> None:
    telemetry.setup(
        f"migsched-{service_cls.name}",
        endpoint=settings.otlp_endpoint,
        sample_ratio=settings.trace_sample_ratio,
    )
    probes = health.Probes()
    if settings.metrics_port:  # a daemon thread serving the probes and this process's registry
        health.serve(settings.metrics_port, probes)
    ticking = asyncio.create_task(probes.keep_ticking())
    svc = await service_cls.create(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await svc.start()
    probes.readiness = svc.readiness
    await stop.wait()
    await svc.stop()
    ticking.cancel()
    telemetry.shutdown()
