"""The role table is the single source of truth: checked-in configs and docs match it, and it stays tight."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import access

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_nats_config_is_the_rendered_role_table() -> None:
    assert (ROOT / "deploy/nats/nats-server.conf").read_text() == access.render_nats(access.DEFAULT_NODES)


def test_the_checked_in_redis_acl_template_is_the_rendered_role_table() -> None:
    assert (ROOT / "deploy/redis/users.acl").read_text() == access.render_redis()


def test_the_security_doc_shows_the_current_role_table() -> None:
    assert access.markdown_table() in (ROOT / "docs/operations.md").read_text()


def test_an_executor_is_granted_nothing_that_names_another_node_or_a_wildcard_command() -> None:
    nodes = ["node-a", "node-b", "gpu-17"]
    for u in access.users(nodes):
        if u.node is None:
            continue
        grants = " ".join(u.publish + u.subscribe)
        assert all(other not in grants for other in nodes if other != u.node), u.name
        assert "cmd.*" not in grants and "cmd.>" not in grants and "$JS.API.>" not in grants
        assert "$JS.API.CONSUMER.DURABLE.CREATE" not in grants  # the create form without the filter subject


@pytest.mark.parametrize("node", ["a.b", "*", ">", "Node", "", "-a", "a" * 64, "a b"])
def test_a_node_name_that_could_widen_a_subject_is_refused(node: str) -> None:
    with pytest.raises(access.AccessError):
        access.users([node])


def test_every_user_receives_replies_only_on_its_own_inbox() -> None:
    for u in access.users():
        inboxes = [s for s in u.subscribe if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX.{u.name}.>"]
        assert access.connect_options(u.name, "x")["inbox_prefix"] == f"_INBOX.{u.name}"


def test_the_rendered_redis_file_holds_hashes_never_the_passwords() -> None:
    secrets = access.generate_secrets()
    text = access.render_redis(secrets)
    assert not any(pw in text for pw in secrets.values())
    assert text.startswith("user default off")
    assert text.count(" on resetpass #") == 5


def test_generated_passwords_are_distinct_and_parse_as_plain_nats_strings() -> None:
    secrets = access.generate_secrets(["n1", "n2"])
    assert len(set(secrets.values())) == len(secrets)
    assert all(access.PASSWORD_RE.match(p) for p in secrets.values())


@pytest.mark.parametrize("password", ["short", "123456789012345678", 'has"quote-and-more-chars', "x" * 200])
def test_a_password_that_nats_would_misparse_is_refused(password: str) -> None:
    secrets = access.generate_secrets()
    secrets["MIGSCHED_NATS_PASSWORD_PUBLISHER"] = password
    with pytest.raises(access.AccessError):
        access.render_nats(access.DEFAULT_NODES, secrets)


def test_rendering_with_missing_password_variables_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert access.main(["render", "redis", "--env-file", "/dev/null"]) == 2
    assert "MIGSCHED_REDIS_PASSWORD_AUDIT" in capsys.readouterr().err
