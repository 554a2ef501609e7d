"""Shared fixtures: real NATS and Redis (the URL from the environment, a server answering on the default port,
or a private one), and unique prefixes per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from services.common.testing import private_state
from shared.localcluster import NatsCluster, RedisCluster, start_nats_cluster, start_redis_cluster
from shared.localservers import LocalServer, resolve
from shared.state import RedisState


@pytest.fixture(scope="session")
def nats_server() -> Iterator[LocalServer]:
    server = resolve("nats")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalServer]:
    server = resolve("redis")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of three primaries with a replica each, from the binaries, started once for the tests that
    ask for it (and never faulted: a test that kills a node starts its own)."""
    rig = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield rig
    rig.stop()


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """Three nats-servers routed into one JetStream cluster, one cluster per test module (a module may kill its
    servers without touching another's)."""
    c = start_nats_cluster(3, tmp_path_factory.mktemp("nats-cluster"))
    yield c
    c.stop()


@pytest.fixture
def nats_url(nats_server: LocalServer) -> str:
    return nats_server.url


@pytest.fixture
def redis_url(redis_server: LocalServer) -> str:
    return redis_server.url


@pytest.fixture
def prefix() -> str:
    """A unique namespace for one test's streams, subjects and Redis keys."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
async def redis_state(prefix: str, nats_url: str, redis_url: str) -> AsyncIterator[RedisState]:
    """The store the services use, on keys of this test only; wiped and closed after the test."""
    async with private_state(prefix, nats_url, redis_url) as state:
        yield state
