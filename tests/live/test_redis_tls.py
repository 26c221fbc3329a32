"""Redis across hosts, over TLS: a redis-server that listens only on a TLS port, with a
password and a certificate from a CA made on the spot (openssl), and the whole system
on it through one `rediss://` URL that pins that CA:

    rediss://:PASSWORD@HOST:PORT/0?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem

The collector and a device worker run on it; this process's Redis client
(tasks/store/connection.py) and Celery's broker and result backend round-trip a request
through them. A client that does not pin the CA is refused, and so is plain TCP.
docs/security.md explains the URL.

Skips, saying why, when there is no openssl or when redis-server was built without TLS.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from systems import running

from batching_site.celery import app
from batching_site.harness import LocalSystem, free_port
from dynamic_batching.edge.client import submit
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(folder: Path) -> None:
    """ca.pem (a CA of its own) and server.pem/server.key for localhost and 127.0.0.1."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca", cwd=folder
    )
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "1", "-extfile", "san.ext",
        cwd=folder,
    )  # fmt: skip


def pinned(url: str, ca: Path) -> str:
    return f"{url}?ssl_cert_reqs=required&ssl_ca_certs={ca}"


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[tuple[str, Path]]:
    """A TLS-only Redis: (its rediss:// URL without the TLS options, the CA file)."""
    binary = shutil.which("redis-server")
    if binary is None or shutil.which("openssl") is None:
        pytest.skip("needs redis-server and openssl: `apt-get install -y redis-server openssl`")
    folder = Path(tempfile.mkdtemp(prefix="redis-tls-"))
    server: subprocess.Popen[bytes] | None = None
    try:
        make_certificates(folder)
        port, password = free_port(), secrets.token_urlsafe(16)
        server = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--tls-port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--tls-cert-file",
                "server.pem",
                "--tls-key-file",
                "server.key",
                "--tls-ca-cert-file",
                "ca.pem",
                # Clients prove themselves with the password, not a certificate of their own.
                "--tls-auth-clients",
                "no",
                "--requirepass",
                password,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(folder),
            ],  # fmt: skip
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        url = f"rediss://:{password}@localhost:{port}/0"
        deadline = time.monotonic() + 15
        while True:
            if server.poll() is not None:
                out = server.stdout.read().decode(errors="replace") if server.stdout else ""
                if "tls" in out.lower():
                    pytest.skip(f"{binary} has no TLS support (`redis-server --tls-port` fails): {out.strip()[-200:]}")
                pytest.fail(f"redis-server exited: {out[-2000:]}")
            try:
                redis.Redis.from_url(pinned(url, folder / "ca.pem"), socket_connect_timeout=1).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail("the TLS Redis did not answer within 15 s")
                time.sleep(0.05)
        yield url, folder / "ca.pem"
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_system_runs_over_rediss_with_the_ca_pinned(tls_redis: tuple[str, Path]) -> None:
    url, ca = tls_redis
    system = LocalSystem(devices=["cpu:0"], preload="synthetic", redis_url=pinned(url, ca), env={"TORCH_THREADS": "1"})
    with running(system, timeout=90):
        # This process's client: TLS, verifying the server against our CA only.
        client = shared_state.client()
        assert client.ping()
        kwargs = client.connection_pool.connection_kwargs
        assert issubclass(client.connection_pool.connection_class, redis.SSLConnection)
        assert (kwargs["ssl_cert_reqs"], kwargs["ssl_ca_certs"]) == ("required", str(ca))

        # Celery's broker connection and result backend take the same options from the URL.
        with app.connection_for_write() as conn:
            assert conn.transport_cls == "rediss"
            assert conn.ssl["ssl_ca_certs"] == str(ca)
        assert app.backend.connparams["ssl_ca_certs"] == str(ca)

        # The round trip: broker to the collector, a batch to the device worker, the
        # answer back through the result backend, every hop over TLS (the server has no
        # plain port at all).
        text = "a request that crossed TLS"
        assert submit(text, model="synthetic").get(timeout=30) == synthetic.embed(text)


def test_an_unpinned_or_plain_client_is_refused(tls_redis: tuple[str, Path]) -> None:
    url, ca = tls_redis
    # The system's CA store does not know our CA: verification fails without the pin.
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        redis.Redis.from_url(f"{url}?ssl_cert_reqs=required", socket_connect_timeout=2).ping()
    # Plain TCP to the TLS port never gets an answer.
    plain = url.replace("rediss://", "redis://", 1)
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        redis.Redis.from_url(plain, socket_connect_timeout=2, socket_timeout=2).ping()
    # And the pinned URL still works, so the refusals above are about the pin.
    assert redis.Redis.from_url(pinned(url, ca), socket_connect_timeout=2).ping()
