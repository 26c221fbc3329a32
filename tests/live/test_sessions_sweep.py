"""Expired sessions are deleted on a schedule (issue 42, finding 11): with the open demo
on, every visitor without a cookie leaves a session row, and nothing deleted them. The
web role comes with a `sessions` program (make run, the harness, compose) that runs
Django's clearsessions every hour; here its command runs every second on a database of
its own, and the expired row goes while a live one stays."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import poll_until

from batching_site import processes

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]

ROWS = """
from datetime import timedelta
from django.contrib.sessions.models import Session
from django.utils import timezone
now = timezone.now()
Session.objects.create(session_key="expired" + "x" * 25, session_data="", expire_date=now - timedelta(days=1))
Session.objects.create(session_key="current" + "x" * 25, session_data="", expire_date=now + timedelta(days=1))
"""
COUNT = "from django.contrib.sessions.models import Session; print(sorted(s.session_key[:7] for s in Session.objects.all()))"


def test_the_web_role_sweeps_expired_sessions_on_a_schedule(tmp_path: Path) -> None:
    assert processes.programs(["cpu:0"])["sessions"] == processes.sessions_command(every_s=3600)
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"}

    def manage(*args: str) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    manage("migrate", "-v", "0")
    manage("shell", "-c", ROWS)
    assert manage("shell", "-c", COUNT) == "['current', 'expired']"
    sweeper = subprocess.Popen(processes.sessions_command(every_s=1), cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 30
        while manage("shell", "-c", COUNT) != "['current']":
            assert time.monotonic() < deadline, "the expired session was not deleted"
            time.sleep(0.5)
    finally:
        sweeper.kill()
        sweeper.wait()


def sleeping_children(pid: int) -> list[int]:
    found = []
    try:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            if Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"):
                found.append(int(child))
    except FileNotFoundError:  # one of them ended meanwhile
        pass
    return found


def test_the_sweeps_wait_dies_with_it(tmp_path: Path) -> None:
    # A supervisor killed outright takes the loop's shell with it (the lifetime wrapper),
    # and the shell's `sleep 3600` was left behind, a child of init, after every such
    # stop (three of them after one fresh-clone make test).
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    sweeper = subprocess.Popen(processes.sessions_command(every_s=3600), cwd=ROOT, env=env)
    try:
        waits = poll_until(lambda: sleeping_children(sweeper.pid), "the sweep to come to its wait", timeout=60)
    finally:
        sweeper.kill()
        sweeper.wait()
    poll_until(lambda: not Path(f"/proc/{waits[0]}").exists(), "the sweep's wait to die with it", timeout=10)
