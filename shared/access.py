"""Who may do what: one role table that yields the NATS users/permissions and the Redis ACL users.

The compose stack's configs (``deploy/nats/nats-server.conf``, ``deploy/redis/users.acl``), the security docs
and the access tests are all rendered from ``ROLES`` below, so they cannot drift apart. Subjects follow
docs/operations.md, Security. Everything not allowed is denied: a NATS ``allow`` list denies the rest, a Redis
user starts from ``-@all``.

Two conventions every client of a locked-down server must follow (they are what makes the rules tight):

- **Private inboxes.** A user may only receive replies on ``_INBOX.<user>.>``, so one service cannot read
  another's JetStream acks or pull-fetch replies (which carry the fetched messages). Connect with
  ``nats.connect(..., inbox_prefix=inbox_prefix(user))``.
- **Executor durables.** The executor of node ``n`` consumes stream ``CMD`` only through the durable
  ``executor-n`` filtered to ``cmd.n`` (``durable_for(n)``). Its create permission names the filter inside the
  API subject (``$JS.API.CONSUMER.CREATE.CMD.<durable>.cmd.<n>``), which the server checks against the
  consumer's config, so it cannot point its consumer at another node's commands.

Secrets: templates reference environment variables (``MIGSCHED_NATS_PASSWORD_<USER>``,
``MIGSCHED_REDIS_PASSWORD_<USER>``); NATS substitutes them itself and refuses to start when one is missing,
and the Redis template holds unfillable hash placeholders so an unrendered file also fails closed.
``render_*`` with concrete passwords produces runnable files; Redis gets SHA-256 hashes, never plaintext.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.errors import MigschedError

ACCOUNT = "MIGSCHED"
DEFAULT_NODES: tuple[str, ...] = ("node-a", "node-b")
DEFAULT_KEY_PREFIX = "{migsched:"
"""Redis keys are hash-tagged per shard: ``{migsched:<shard>}:...`` (shared.settings, namespace "")."""
NODE_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
"""A node name becomes a subject token, a durable name and part of a user name: no dots or wildcards."""
PASSWORD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{15,127}$")
"""Unquoted NATS variables are parsed as config values, so passwords start with a letter and stay plain."""


class AccessError(MigschedError, ValueError):
    """A role, node name or password cannot be turned into a safe permission or config."""


@dataclass(frozen=True)
class Consume:
    """Pulling from one stream. ``durable``/``filter`` None = any durable/filter (trusted services only)."""

    stream: str
    durable: str | None = None
    filter: str | None = None
    retired: tuple[str, ...] = ()
    """Durables an older version of the service left on this stream, which it deletes at start (only those)."""


@dataclass(frozen=True)
class Role:
    """One kind of client. ``user`` may contain ``{node}``: one user per node is generated from it."""

    user: str
    summary: str
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    consume: tuple[Consume, ...] = ()
    redis: str | None = None
    """Redis ACL rules with ``{prefix}`` for the key namespace; None = no Redis user."""

    @property
    def per_node(self) -> bool:
        return "{node}" in self.user


# Redis rule sets. Services run Lua CAS transitions on their own namespace; dangerous and cache-wiping
# commands stay out even though @scripting/@connection would otherwise bring some in.
SERVICE_REDIS = ("resetkeys ~{prefix}* resetchannels -@all +@read +@write +@scripting +@transaction "
                 "+@connection -@dangerous -script|flush -script|kill -function")
AUDIT_REDIS = ("resetkeys %R~{prefix}* resetchannels -@all +@read +@connection -@dangerous "
               "+eval_ro +evalsha_ro")
ADMIN_REDIS = "~* &* +@all"

ROLES: tuple[Role, ...] = (
    Role("publisher", "external job queues, `migsched submit/cancel`, the load generator",
         publish=("jobs.submit", "jobs.cancel")),
    # No jobs.exit: the node registry checks a node's report against the state and publishes the
    # exit itself (shared/events/), so an executor cannot end another node's jobs.
    Role("executor-{node}", "the executor of one GPU node",
         publish=("node.{node}.report", "node.{node}.heartbeat", "dlq.cmd.{node}"),
         subscribe=("cmd.{node}",),
         consume=(Consume("CMD", durable="executor-{node}", filter="cmd.{node}"),)),
    Role("balancer", "decides placements (consumes jobs.*, sched.capacity), sends their place commands and "
         "announces preemptions",
         publish=("cmd.*", "sched.preempted", "dlq.>"),
         consume=(Consume("JOBS"), Consume("SCHED")), redis=SERVICE_REDIS),
    Role("registry", "executor commands after moves, cancels and exits; node registry (reports, heartbeats, "
         "exits)",
         publish=("cmd.*", "jobs.exit", "sched.capacity", "dlq.>"),
         consume=(Consume("SCHED", retired=("partitioner-placed",)), Consume("JOBS", retired=("partitioner-exit",)),
                  Consume("NODE")),
         redis=SERVICE_REDIS),
    Role("migration-planner", "plans defragmenting moves on job exit",
         publish=("sched.migrate", "dlq.>"),
         consume=(Consume("JOBS", retired=("planner-exit",)),), redis=SERVICE_REDIS),
    Role("audit", "read-only: `migsched status/check`, the load recorder, dashboards",
         subscribe=("jobs.>", "sched.>", "cmd.>", "node.>", "dlq.>"), redis=AUDIT_REDIS),
    Role("admin", "operators and stack bootstrap: streams, consumers, dead letters",
         publish=("$JS.API.>", "$JS.ACK.>"), subscribe=("$JS.EVENT.>", "dlq.>"), redis=ADMIN_REDIS),
)


def check_node(node: str) -> str:
    if not NODE_RE.match(node):
        raise AccessError(f"node name {node!r} is not a lowercase DNS label (a-z, 0-9, '-')")
    return node


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix a user must connect with (``nats.connect(inbox_prefix=...)``)."""
    return f"_INBOX.{user}"


def durable_for(node: str) -> str:
    """The CMD durable consumer of ``node``'s executor."""
    return f"executor-{check_node(node)}"


@dataclass(frozen=True)
class User:
    """A concrete user: a role bound to a node (for per-node roles) with its expanded permissions."""

    name: str
    role: Role
    node: str | None
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    @property
    def redis_rules(self) -> str | None:
        return self.role.redis

    def env_var(self, system: str) -> str:
        """``MIGSCHED_NATS_PASSWORD_EXECUTOR_NODE_A`` style: where this user's password is read from."""
        return f"MIGSCHED_{system.upper()}_PASSWORD_{self.name.upper().replace('-', '_')}"


def _consume_subjects(c: Consume) -> list[str]:
    """What a JetStream pull consumer needs (nats-py 2.16 against nats-server ≥ 2.9)."""
    s = c.stream
    retire = [f"$JS.API.CONSUMER.DELETE.{s}.{d}" for d in c.retired]
    if c.durable is None:  # trusted service: any durable, any filter, on its own streams
        return [f"$JS.API.STREAM.INFO.{s}", f"$JS.API.CONSUMER.INFO.{s}.*",
                f"$JS.API.CONSUMER.CREATE.{s}.*", f"$JS.API.CONSUMER.CREATE.{s}.*.>",
                f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.*", f"$JS.API.CONSUMER.MSG.NEXT.{s}.*",
                f"$JS.ACK.{s}.>", *retire]
    if c.filter is None:
        raise AccessError(f"a consumer pinned to durable {c.durable} must also pin its filter subject")
    # No DURABLE.CREATE (legacy form without the filter in the subject) and no STREAM.INFO: an executor
    # learns nothing about other nodes, not even their queue lengths.
    return [f"$JS.API.CONSUMER.INFO.{s}.{c.durable}",
            f"$JS.API.CONSUMER.CREATE.{s}.{c.durable}.{c.filter}",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.{c.durable}", f"$JS.ACK.{s}.{c.durable}.>"]


def users(nodes: Iterable[str] = DEFAULT_NODES, roles: Iterable[Role] = ROLES) -> list[User]:
    """Every concrete user, per-node roles expanded once per node, in table order."""
    nodes = [check_node(n) for n in nodes]
    if len(set(nodes)) != len(nodes):
        raise AccessError("node names repeat")
    out: list[User] = []
    for role in roles:
        for node in nodes if role.per_node else [None]:
            def fill(text: str, node: str | None = node) -> str:
                return text.replace("{node}", node) if node is not None else text
            name = fill(role.user)
            pub = [fill(p) for p in role.publish]
            for c in role.consume:
                pub += [fill(p) for p in _consume_subjects(c)]
            if role.consume:  # locating a stream by subject and account limits: metadata only
                pub += ["$JS.API.INFO", "$JS.API.STREAM.NAMES"]
            sub = [inbox_prefix(name) + ".>", *(fill(s) for s in role.subscribe)]
            # a trusted service tells its consumers' leader elections apart where the server does not say
            # since when a leader leads (``shared.bus.elections``)
            sub += [f"$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.{c.stream}.*" for c in role.consume
                    if c.durable is None]
            out.append(User(name, role, node, tuple(dict.fromkeys(pub)), tuple(dict.fromkeys(sub))))
    return out


def generate_password() -> str:
    return "p" + secrets.token_hex(24)


def check_password(user: str, password: str) -> str:
    if not PASSWORD_RE.match(password):
        raise AccessError(f"password for {user} must match {PASSWORD_RE.pattern} (letters, digits, '_'; 16+)")
    return password


def generate_secrets(nodes: Iterable[str] = DEFAULT_NODES) -> dict[str, str]:
    """A fresh password for every NATS and Redis user, keyed by its environment variable."""
    out: dict[str, str] = {}
    for u in users(nodes):
        out[u.env_var("nats")] = generate_password()
        if u.redis_rules is not None:
            out[u.env_var("redis")] = generate_password()
    return out


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _subject_list(subjects: Iterable[str]) -> str:
    return "[" + ", ".join(_q(s) for s in subjects) + "]"


NATS_HEAD = """\
# migsched NATS server. GENERATED from the role table in shared/access.py — do not edit by hand:
#   python -m shared.access render nats --template --nodes {nodes} --out deploy/nats/nats-server.conf
# Passwords (MIGSCHED_NATS_PASSWORD_<USER>) and the JetStream directory (MIGSCHED_NATS_STORE_DIR) are read
# from the environment; nats-server refuses to start when one is missing. Clients must connect with
# inbox_prefix "_INBOX.<user>" (see docs/operations.md, Security).

listen: "0.0.0.0:4222"
server_name: "migsched-nats"
max_payload: 1MB
max_pending: 64MB
write_deadline: "10s"
# http_port: 8222          # monitoring endpoint: expose on a private network only

jetstream {{
  store_dir: $MIGSCHED_NATS_STORE_DIR   # file storage, e.g. /data: streams survive a restart
  max_file_store: 10GB
  max_memory_store: 256MB
}}

# TLS: uncomment, mount the certificates, and use tls:// URLs (docs/operations.md, Security; nats-server.tls.conf).
# tls {{
#   cert_file: "/etc/nats/tls/server.crt"
#   key_file:  "/etc/nats/tls/server.key"
#   ca_file:   "/etc/nats/tls/ca.crt"
#   verify:    true            # mutual TLS: clients present a certificate signed by ca_file
#   timeout:   2
# }}

"""


def render_nats(nodes: Iterable[str] = DEFAULT_NODES, passwords: Mapping[str, str] | None = None) -> str:
    """The NATS server config. ``passwords`` maps env-var names to values; None = ``$VAR`` references."""
    nodes = list(nodes)
    lines = [NATS_HEAD.format(nodes=",".join(nodes)), "accounts {", f"  {ACCOUNT} {{",
             "    jetstream: enabled", "    users: ["]
    for u in users(nodes):
        var = u.env_var("nats")
        pw = f"${var}" if passwords is None else _q(check_password(u.name, passwords[var]))
        pub = f"allow: {_subject_list(u.publish)}" if u.publish else 'deny: [">"]'
        lines += [f"      # {u.role.summary}",
                  f"      {{ user: {_q(u.name)}, password: {pw}, permissions: {{",
                  f"          publish: {{ {pub} }}",
                  f"          subscribe: {{ allow: {_subject_list(u.subscribe)} }}",
                  "      } }"]
    lines += ["    ]", "  }", "}", ""]
    return "\n".join(lines)


def render_redis(passwords: Mapping[str, str] | None = None, key_prefix: str = DEFAULT_KEY_PREFIX,
                 nodes: Iterable[str] = DEFAULT_NODES) -> str:
    """The Redis ACL file. ``passwords`` maps env-var names to values; None = the fail-closed template."""
    if not re.match(r"^[A-Za-z0-9_:{}.-]+$", key_prefix):
        raise AccessError(f"key prefix {key_prefix!r} would widen the key pattern")
    # Redis ACL files allow no comments: the provenance note lives in deploy/redis/README.md.
    # The default user is disabled: every client authenticates as a named user.
    lines = ["user default off resetpass resetkeys resetchannels -@all"]
    for u in users(nodes):
        if u.redis_rules is None or u.node is not None:
            continue
        var = u.env_var("redis")
        if passwords is None:
            secret = "#${" + var + "_SHA256}"
        else:
            secret = "#" + hashlib.sha256(check_password(u.name, passwords[var]).encode()).hexdigest()
        lines.append(f"user {u.name} on resetpass {secret} " + u.redis_rules.format(prefix=key_prefix))
    return "\n".join(lines) + "\n"


def connect_options(user: str, password: str) -> dict[str, str]:
    """Keyword arguments for ``nats.connect`` as ``user`` on a locked-down server."""
    return {"user": user, "password": password, "inbox_prefix": inbox_prefix(user)}


def markdown_table() -> str:
    """The role table as docs/operations.md (Security) shows it (a test keeps the two equal)."""
    def show(items: Iterable[str]) -> str:
        return ", ".join(f"`{i.replace('{node}', '<node>')}`" for i in items) or "nothing"

    rows = ["| user | for | publishes | pulls from (JetStream) | subscribes (core) | Redis |",
            "|---|---|---|---|---|---|"]
    for role in ROLES:
        pulls = ", ".join(f"{c.stream} (any durable)" if c.durable is None
                          else f"{c.stream} via durable `{c.durable}` on `{c.filter}`" for c in role.consume)
        pulls = pulls.replace("{node}", "<node>") or "nothing"
        subs = show((inbox_prefix(role.user) + ".>", *role.subscribe))
        # a bare | would end the Markdown cell (the rules name subcommands as script|flush)
        redis = (f"`{role.redis.format(prefix=DEFAULT_KEY_PREFIX)}`".replace("|", "\\|") if role.redis
                 else "no user")
        rows.append(f"| `{role.user.replace('{node}', '<node>')}` | {role.summary} | {show(role.publish)} "
                    f"| {pulls} | {subs} | {redis} |")
    return "\n".join(rows) + "\n"


def _passwords_from(env: Mapping[str, str], nodes: list[str]) -> dict[str, str]:
    need = {u.env_var("nats") for u in users(nodes)}
    need |= {u.env_var("redis") for u in users(nodes) if u.redis_rules is not None}
    missing = sorted(need - env.keys())
    if missing:
        raise AccessError("missing password variables (make them with `python -m shared.access secrets`): "
                          + ", ".join(missing))
    return {k: env[k] for k in need}


def read_env_file(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                out[k.strip()] = v.strip().strip('"').strip("'")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import sys

    ap = argparse.ArgumentParser(prog="python -m shared.access", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("secrets", help="print a fresh VAR=password line per user (a private env file)")
    r = sub.add_parser("render", help="write a NATS config or Redis ACL file")
    r.add_argument("what", choices=["nats", "redis"])
    r.add_argument("--out", default="-", help="file to write (default stdout)")
    r.add_argument("--template", action="store_true",
                   help="keep password references (the checked-in form) instead of filling them in")
    r.add_argument("--env-file", help="read passwords from this file as well as the environment")
    r.add_argument("--key-prefix", default=DEFAULT_KEY_PREFIX, help="Redis key namespace of the services")
    sub.add_parser("table", help="the role table in Markdown")
    for p in (s, r):
        p.add_argument("--nodes", default=",".join(DEFAULT_NODES), help="comma-separated executor node names")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "table":
            sys.stdout.write(markdown_table())
            return 0
        nodes = [n for n in args.nodes.split(",") if n]
        if args.cmd == "secrets":
            sys.stdout.write("".join(f"{k}={v}\n" for k, v in generate_secrets(nodes).items()))
            return 0
        pw = None
        if not args.template:
            env = dict(os.environ) | (read_env_file(args.env_file) if args.env_file else {})
            pw = _passwords_from(env, nodes)
        text = (render_nats(nodes, pw) if args.what == "nats"
                else render_redis(pw, key_prefix=args.key_prefix, nodes=nodes))
    except AccessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out == "-":
        sys.stdout.write(text)
    else:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if pw else 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
