"""Talking to a running system's own web process over HTTP, as a script would."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

from batching_site.harness import LocalSystem


def api_token(system: LocalSystem) -> str:
    """A token of a fresh user of the system's own web process (its own database)."""
    username = f"chaos-{uuid.uuid4().hex[:8]}"
    manage = [sys.executable, "manage.py"]
    env = system.env()
    subprocess.run(
        [
            *manage,
            "shell",
            "-c",
            f"from django.contrib.auth.models import User; User.objects.create_user({username!r})",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [*manage, "create_api_token", username], env=env, check=True, capture_output=True, text=True
    ).stdout
    return out.strip().splitlines()[-1]


def http(
    system: LocalSystem, method: str, path: str, body: object = None, *, token: str | None = None
) -> tuple[int, dict]:  # type: ignore[type-arg]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{system.web_port}{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError:
        return 0, {}  # not listening (yet)
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        return status, {"body": raw.decode(errors="replace")}
