"""The front door on this machine: Debian's caddy with the Caddyfile compose mounts
(batching_site/deploy/Caddyfile), in front of the web process with production settings
(DEBUG off, secure cookies, DJANGO_BEHIND_TLS_PROXY) and Flower, all started by the
harness the way `make run` starts them.

Debian's chromium logs in to the admin over HTTPS through it. Caddy's certificate comes
from a CA it made on the spot, which the browser is told to accept. Flower is for staff
only and read-only; plain HTTP only redirects.

`make test` installs caddy and chromium when they are missing (apt); elsewhere the test
skips and says why.
"""

from __future__ import annotations

import http.client
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator

import pytest
from chromium import launched
from polling import poll_until

from batching_site.harness import LocalSystem

pytestmark = pytest.mark.live

STAFF = ("door-staff", secrets.token_urlsafe(16))


class _Loopback(http.client.HTTPSConnection):
    """HTTPS to this machine under any host name (*.localhost resolves in browsers, not
    in glibc): the name goes in the TLS handshake (SNI) and the Host header."""

    def connect(self) -> None:
        raw = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def https_response(system: LocalSystem, path: str, method: str = "GET", *, host: str = "localhost") -> tuple[int, str]:
    """One request through the proxy, certificate unchecked (the CA is minutes old):
    its status and Location."""
    assert system.proxy is not None
    conn = _Loopback(host, system.proxy.https_port, timeout=5, context=ssl._create_unverified_context())
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Location") or ""
    finally:
        conn.close()


def https_status(system: LocalSystem, path: str, method: str = "GET", *, host: str = "localhost") -> int:
    return https_response(system, path, method, host=host)[0]


@pytest.fixture(scope="module")
def door() -> Iterator[LocalSystem]:
    if shutil.which("caddy") is None:
        pytest.skip("no caddy: `apt-get install -y caddy` (make test does it)")
    system = LocalSystem(devices=[], flower=True, proxy=True)
    assert system.proxy is not None
    origin = f"https://localhost:{system.proxy.https_port}"
    # Production settings, as compose passes them; nothing from a developer's .env.
    system.extra_env.update(
        {
            "DJANGO_READ_DOT_ENV": "0",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
            "DJANGO_ALLOWED_HOSTS": f"localhost,127.0.0.1,{system.proxy.flower_site}",
            "DJANGO_HTTPS": "1",
            "DJANGO_BEHIND_TLS_PROXY": "1",
            "DJANGO_SECURE_SSL_REDIRECT": "1",
            "DJANGO_CSRF_TRUSTED_ORIGINS": origin,
            "FLOWER_URL": f"https://{system.proxy.flower_site}:{system.proxy.https_port}/flower/",
        }
    )
    try:
        system.start(timeout=60)
        staff = f"from django.contrib.auth.models import User; User.objects.create_superuser({STAFF[0]!r}, password={STAFF[1]!r})"
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", staff], env=system.env(), check=True, capture_output=True
        )

        def answers() -> bool:
            try:
                return https_status(system, "/healthz") in (200, 503)
            except OSError:
                return False

        poll_until(answers, "the proxy to answer over HTTPS", timeout=30, interval=0.1)
        yield system
    finally:
        system.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with launched() as b:
        yield b


def test_staff_logs_in_to_the_admin_over_https_and_reaches_flower_read_only(door: LocalSystem, browser) -> None:  # type: ignore[no-untyped-def]
    assert door.proxy is not None
    base = f"https://localhost:{door.proxy.https_port}"
    # Flower has a host name of its own: another origin than the site's (issue 42, finding 10).
    flower_base = f"https://{door.proxy.flower_site}:{door.proxy.https_port}"
    anonymous = browser.new_context(ignore_https_errors=True)
    staff = browser.new_context(ignore_https_errors=True)
    try:
        for context in (anonymous, staff):
            context.set_default_timeout(15_000)

        # Without a login, Flower is the admin's login form on the site, never Flower.
        page = anonymous.new_page()
        page.goto(f"{flower_base}/flower/")
        assert page.url == f"{base}/admin/login/?next=/auth/flower%3Fnext%3D/flower/"
        assert "Flower" not in page.title()

        page = staff.new_page()
        page.goto(f"{base}/admin/")
        assert "/admin/login/" in page.url
        page.fill("#id_username", STAFF[0])
        page.fill("#id_password", STAFF[1])
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/admin/")
        assert page.inner_text("#site-name") and "Site administration" in page.content()
        session = {c["name"]: c for c in staff.cookies()}["sessionid"]
        assert session["secure"] and session["httpOnly"]

        # An old link to Flower on the site's host name goes on to Flower's, where the
        # staff member is logged in with a one-time ticket from the site's host name.
        flower = page.goto(f"{base}/flower/")
        assert flower is not None and flower.status == 200
        assert "Flower" in page.title()
        assert page.url == f"{flower_base}/flower/"
        sessions = {c["domain"]: c for c in staff.cookies() if c["name"] == "sessionid"}
        assert set(sessions) == {"localhost", door.proxy.flower_site}, "one session per host name"
        assert sessions["localhost"]["value"] != sessions[door.proxy.flower_site]["value"]
        # Flower's pages cannot read the site's: another origin, and no framing.
        assert (
            page.evaluate(f"fetch('{base}/dashboard/', {{credentials: 'include'}}).then(() => 'read', () => 'refused')")
            == "refused"
        )

        # Staff or not, Flower's control API is refused at the door.
        refused = {
            ("POST", "/flower/api/task/async-apply/gpu_workers.run_batch"),
            ("POST", "/flower/api/worker/shutdown/collector@x"),
            ("GET", "/flower/api/task/info/0"),
            ("POST", "/flower//api/task/revoke/0"),
            ("POST", "/flower/api/workers"),
        }
        # From Flower's own page, with the staff member's session there (the browser
        # resolves *.localhost; Playwright's own HTTP client does not).
        fetch = (
            "([path, method]) => fetch(path, {method, body: method === 'POST' ? '{}' : undefined}).then(r => r.status)"
        )
        for method, path in sorted(refused):
            assert page.evaluate(fetch, [path, method]) == 403, (method, path)
            assert https_status(door, path, method, host=door.proxy.flower_site) == 403, (method, path)
        # Flower's own pages still read for staff (its API answers 401 to everyone:
        # Flower has no login of its own here, and keeps its API closed without one).
        assert page.evaluate(fetch, ["/flower/tasks", "GET"]) == 200
    finally:
        anonymous.close()
        staff.close()


def test_plain_http_only_redirects_to_https(door: LocalSystem) -> None:
    assert door.proxy is not None
    conn = http.client.HTTPConnection("127.0.0.1", door.proxy.http_port, timeout=5)
    try:
        conn.request("GET", "/admin/?x=1", headers={"Host": f"localhost:{door.proxy.http_port}"})
        response = conn.getresponse()
        assert response.status in (301, 308)
        assert response.getheader("Location") == f"https://localhost:{door.proxy.https_port}/admin/?x=1"
    finally:
        conn.close()


def test_a_made_up_session_is_sent_to_the_login(door: LocalSystem) -> None:
    assert door.proxy is not None
    conn = _Loopback(door.proxy.flower_site, door.proxy.https_port, timeout=5, context=ssl._create_unverified_context())
    try:
        conn.request("GET", "/flower/", headers={"Cookie": "sessionid=made-up"})
        response = conn.getresponse()
        assert response.status == 302
        assert response.getheader("Location") == (
            f"https://localhost:{door.proxy.https_port}/auth/flower?next=/flower/"
        )
    finally:
        conn.close()


def test_flowers_host_name_serves_flower_and_the_ticket_door_only(door: LocalSystem) -> None:
    assert door.proxy is not None
    flower = door.proxy.flower_site
    assert https_response(door, "/", host=flower)[0] == 302
    assert https_status(door, "/admin/", host=flower) == 404, "the site is not served on Flower's host name"
    assert https_status(door, "/api/v1/stats", host=flower) == 404
    assert https_status(door, "/_staff/enter?ticket=made-up", host=flower) == 403


def test_fifty_slow_bodies_hold_no_web_thread(door: LocalSystem) -> None:
    # Issue 42, finding 9: a POST whose body comes a byte at a time held a gunicorn
    # thread for as long as its sender liked; a handful held all 16. The proxy now reads
    # a whole body before the web sees the request, and cuts a slow one off at 30 s.
    import socket
    import time

    assert door.proxy is not None
    context = ssl._create_unverified_context()
    slow = []
    try:
        for _ in range(50):
            raw = socket.create_connection(("localhost", door.proxy.https_port), timeout=5)
            conn = context.wrap_socket(raw, server_hostname="localhost")
            # A CSRF cookie and no header: Django reads the form body for the token,
            # so an unbuffered body holds the thread that reads it.
            conn.sendall(
                b"POST /login/ HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n"
                b"Cookie: csrftoken=" + b"a" * 32 + b"\r\n"
                b"Content-Length: 1000\r\n\r\nusername=slow&password="
            )
            slow.append(conn)
        time.sleep(1)  # let them reach whatever they would hold
        t0 = time.monotonic()
        assert https_status(door, "/healthz") in (200, 503)  # 5 s timeout: held threads would miss it
        assert https_status(door, "/login/") == 200
        print(f"with 50 slow bodies open, two requests answered in {time.monotonic() - t0:.2f} s")
    finally:
        for conn in slow:
            conn.close()
