"""The Redis ACL users rendered from the role table hold on a real redis-server started with deploy/redis/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.exceptions as rex

from shared import access
from shared.localservers import AOF_REWRITE_MIN_SIZE, REDIS_TUNING, LocalServer, ServerError, start_redis
from shared.state.codec import block_script_source

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "redis"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalServer, dict[str, str]]]:
    secrets = access.generate_secrets()
    acl = tmp_path_factory.mktemp("acl") / "users.acl"
    acl.write_text(access.render_redis(secrets))
    server = start_redis(config=DEPLOY / "redis.conf", aclfile=acl, appendonly=True)
    yield server, secrets
    server.stop()


def client(server: LocalServer, secrets: dict[str, str], user: str) -> redis.Redis:
    var = f"MIGSCHED_REDIS_PASSWORD_{user.upper().replace('-', '_')}"
    return redis.Redis.from_url(server.url, username=user, password=secrets[var], socket_timeout=5)


def test_a_service_works_on_its_own_namespace_with_lua(secured) -> None:
    r = client(*secured, "balancer")
    assert r.set("{migsched:0}:probe", "1")
    # a compare-and-set transition as the services run them: one script, keys declared
    cas = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2]) end"
    assert r.eval(cas, 1, "{migsched:0}:probe", "1", "2") == b"OK"
    assert r.get("{migsched:0}:probe") == b"2"


def test_the_registry_may_keep_the_block_map_of_its_namespace(secured) -> None:
    r = client(*secured, "registry")
    # a new block's shard is chosen in the namespace's block map, a key outside every shard
    assert r.eval(block_script_source(), 1, "{migsched:blocks}", "b0", 2, "0,1") == 0
    assert r.eval(block_script_source(), 1, "{migsched:blocks}", "b1", 2, "0,1") == 1


def test_a_service_user_cannot_run_flushall_config_or_keys(secured) -> None:
    r = client(*secured, "registry")
    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "SET", "appendonly", "no"),
                    ("CONFIG", "GET", "*"),
                    ("KEYS", "*"), ("SCRIPT", "FLUSH"), ("SHUTDOWN",), ("MONITOR",),
                    ("ACL", "LIST")):
        with pytest.raises(rex.NoPermissionError):
            r.execute_command(*command)


def test_a_service_user_cannot_touch_keys_outside_its_namespace(secured) -> None:
    r = client(*secured, "migration-planner")
    with pytest.raises(rex.NoPermissionError):
        r.set("other:key", "x")
    with pytest.raises(rex.NoPermissionError):  # nor through a script that declares a foreign key
        r.eval("return redis.call('SET', KEYS[1], 'x')", 1, "other:key")


def test_the_audit_user_can_read_but_cannot_write(secured) -> None:
    client(*secured, "balancer").set("{migsched:0}:job:j-1", "running")
    audit = client(*secured, "audit")
    assert audit.get("{migsched:0}:job:j-1") == b"running"
    for write in (lambda: audit.set("{migsched:0}:job:j-1", "finished"),
                  lambda: audit.delete("{migsched:0}:x"),
                  lambda: audit.eval("return redis.call('SET', KEYS[1], 'x')", 1, "{migsched:0}:x"),
                  lambda: audit.execute_command("FLUSHALL")):
        with pytest.raises(rex.NoPermissionError):
            write()
    assert client(*secured, "balancer").get("{migsched:0}:job:j-1") == b"running"


def test_the_default_user_cannot_log_in(secured) -> None:
    server, _ = secured
    anonymous = redis.Redis.from_url(server.url, socket_timeout=5)
    with pytest.raises(rex.AuthenticationError):  # NOAUTH on the first command
        anonymous.ping()
    with pytest.raises(rex.AuthenticationError):
        redis.Redis.from_url(server.url, username="default", password="", socket_timeout=5).ping()
    wrong = redis.Redis.from_url(server.url, username="balancer", password="p" + "0" * 20, socket_timeout=5)
    with pytest.raises(rex.AuthenticationError):
        wrong.ping()


def test_the_shipped_redis_conf_keeps_state_durable_and_unevictable(secured) -> None:
    admin = client(*secured, "admin")
    got = {k: admin.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy")}
    assert got == {"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}


def test_the_shipped_redis_conf_packs_job_hashes_and_rewrites_rarely(secured) -> None:
    admin = client(*secured, "admin")
    got = {k: admin.config_get(k)[k] for k in ("hash-max-listpack-value", "rdbcompression")}
    assert got == {"hash-max-listpack-value": "1024", "rdbcompression": "no"}
    assert int(admin.config_get("auto-aof-rewrite-min-size")["auto-aof-rewrite-min-size"]) == 2**30
    # a job-shaped hash (its spec is ~400 bytes of JSON) stays packed
    admin.hset("{t:0}:job:j1", mapping={"state": "running", "spec": "x" * 400, "gpu": "n/0"})
    assert admin.object("encoding", "{t:0}:job:j1") == b"listpack"


def test_private_servers_are_tuned_as_the_shipped_conf() -> None:
    conf = dict(
        line.split(None, 1) for line in (DEPLOY / "redis.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    tuning = dict(zip(REDIS_TUNING[::2], REDIS_TUNING[1::2], strict=True))
    assert {k.removeprefix("--"): v for k, v in tuning.items()} == {
        k.removeprefix("--"): conf[k.removeprefix("--")].strip() for k in tuning
    }
    assert conf["auto-aof-rewrite-min-size"].strip() == AOF_REWRITE_MIN_SIZE


def test_the_unrendered_acl_template_fails_closed() -> None:
    with pytest.raises(ServerError):  # placeholders are not valid password hashes: Redis refuses to start
        start_redis(aclfile=DEPLOY / "users.acl")
