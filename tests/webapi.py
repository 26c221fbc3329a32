"""Talking to a running system's own web process over HTTP, as a script would."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

from batching_site.harness import LocalSystem


def api_token(system: LocalSystem) -> str:
    """A token of a fresh user of the system's own web process (its own database)."""
    return system.user_token(f"chaos-{uuid.uuid4().hex[:8]}")


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
