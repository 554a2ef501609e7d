"""deploy/nats/nats-server.tls.conf on a real nats-server: TLS with client certificates, on top of users."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from shared import access
from shared.localservers import LocalServer, start_nats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30),
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-server.tls.conf"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=20)


def issue(name: str, cwd: Path, san: str | None = None) -> None:
    """A P-256 key and a certificate signed by the test CA (EC keys: fast to make)."""
    req = ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}"]
    openssl(*req, *(["-addext", f"subjectAltName={san}"] if san else []), cwd=cwd)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.crt", "-copy_extensions", "copy", cwd=cwd)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory,
               ) -> Iterator[tuple[LocalServer, dict[str, str], Path]]:
    pki = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "2", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=migsched-test-ca", cwd=pki)
    issue("server", pki, san="IP:127.0.0.1,DNS:localhost")
    issue("publisher", pki)
    secrets = access.generate_secrets()
    env = {**secrets, "MIGSCHED_NATS_TLS_CERT": str(pki / "server.crt"),
           "MIGSCHED_NATS_TLS_KEY": str(pki / "server.key"), "MIGSCHED_NATS_TLS_CA": str(pki / "ca.crt")}
    server = start_nats(config=CONFIG, env=env)
    yield server, secrets, pki
    server.stop()


def context(pki: Path, client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(str(pki / "publisher.crt"), str(pki / "publisher.key"))
    return ctx


async def round_trip(nc: nats.aio.client.Client) -> None:
    """Two flushes: nats-py writes a flush's PING ahead of publishes still pending (test_access_nats.py)."""
    await nc.flush()
    await nc.flush()


def tls_url(server: LocalServer) -> str:
    return server.url.replace("nats://", "tls://")


async def test_a_client_with_a_ca_signed_certificate_and_its_password_gets_in(tls_server) -> None:
    server, secrets, pki = tls_server
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    nc = await nats.connect(tls_url(server), tls=context(pki, client_cert=True), allow_reconnect=False,
                            error_cb=on_error, connect_timeout=10, **access.connect_options(
                                "publisher", secrets["MIGSCHED_NATS_PASSWORD_PUBLISHER"]))
    try:
        await nc.publish("jobs.cancel", b"{}")
        await nc.publish("cmd.node-a", b"{}")  # the user's permissions still apply under TLS
        await round_trip(nc)
        assert nc.is_connected
        assert [str(e).lower() for e in errors] == ['nats: permissions violation for publish to "cmd.node-a"']
    finally:
        await nc.close()


@pytest.mark.parametrize("how", ["no client certificate", "plain TCP", "certificate but wrong password"])
async def test_without_a_certificate_tls_or_the_password_the_connection_is_refused(tls_server,
                                                                                   how: str) -> None:
    server, secrets, pki = tls_server
    password = secrets["MIGSCHED_NATS_PASSWORD_PUBLISHER"]
    kw: dict = {"allow_reconnect": False, "max_reconnect_attempts": 0, "connect_timeout": 3}
    if how == "no client certificate":
        kw |= {"servers": tls_url(server), "tls": context(pki, client_cert=False), "user": "publisher",
               "password": password}
    elif how == "plain TCP":
        kw |= {"servers": server.url, "user": "publisher", "password": password}
    else:
        kw |= {"servers": tls_url(server), "tls": context(pki, client_cert=True), "user": "publisher",
               "password": "p" + "1" * 30}
    with pytest.raises((nats.errors.Error, OSError, ssl.SSLError)):
        nc = await nats.connect(**kw)
        await nc.close()
