"""How ``python -m load.live`` sets up the stack it measures."""

from __future__ import annotations

from pathlib import Path

import pytest

from load.live import RETENTION_S, disk_mib, service_env
from shared.settings import RegistrySettings, load

pytestmark = pytest.mark.unit


def test_a_load_run_keeps_jobs_and_messages_for_the_same_short_retention_unless_told_not_to() -> None:
    settings = load(RegistrySettings, service_env(120.0))
    assert settings.job_retention_s == settings.stream_max_age_s == 120.0
    defaults = load(RegistrySettings, service_env(RETENTION_S))  # a run keeps the services' defaults
    assert defaults.job_retention_s == load(RegistrySettings, {}).job_retention_s
    assert defaults.stream_max_age_s == load(RegistrySettings, {}).stream_max_age_s


def test_a_load_run_can_cap_the_ended_jobs_kept_and_otherwise_keeps_the_services_cap() -> None:
    assert load(RegistrySettings, service_env(0.0, 5000)).job_retention_max == 5000
    default = load(RegistrySettings, {}).job_retention_max
    assert load(RegistrySettings, service_env(0.0)).job_retention_max == default


def test_the_store_size_counts_every_file_below_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "blk").write_bytes(b"x" * 2**20)
    (tmp_path / "meta").write_bytes(b"y" * 2**19)
    assert disk_mib(tmp_path) == 1.5
