"""On CI, a test skipped because a tool that `make test` installs is missing fails
instead (tests/conftest.py): a green run must not hide a broken install step."""

from __future__ import annotations

from conftest import required_tool_missing


def test_a_skip_for_a_tool_make_test_installs_fails_on_ci_only() -> None:
    reason = "no caddy: `apt-get install -y caddy` (make test does it)"
    assert required_tool_missing(reason, {"CI": "true"})
    assert not required_tool_missing(reason, {})
    assert not required_tool_missing("no GPU on this machine", {"CI": "true"})
