"""How ``python -m load.live`` sets up the stack it measures."""

from __future__ import annotations

import pytest

from load.live import RETENTION_S, service_env
from shared.settings import PartitionerSettings, load

pytestmark = pytest.mark.unit


def test_a_load_run_keeps_jobs_and_messages_for_the_same_short_retention_unless_told_not_to() -> None:
    settings = load(PartitionerSettings, service_env(120.0))
    assert settings.job_retention_s == settings.stream_max_age_s == 120.0
    defaults = load(PartitionerSettings, service_env(RETENTION_S))  # a run keeps the services' defaults
    assert defaults.job_retention_s == load(PartitionerSettings, {}).job_retention_s
    assert defaults.stream_max_age_s == load(PartitionerSettings, {}).stream_max_age_s
