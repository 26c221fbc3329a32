"""`make run` supervises the same command lines the tests and containers use: every
process restarts on its own, and `%` in a command (Celery's `%h`) survives."""

from __future__ import annotations

import configparser
import shlex

from batching_site import processes


def test_every_program_restarts_alone_and_keeps_its_command_line() -> None:
    programs = {
        "collector": processes.collector_command(),
        "gpu-cpu0": processes.device_command("cpu:0"),
        "web": processes.web_command(port=8000),
    }
    text = processes.supervisor_config(programs, run_dir="/tmp/run", cwd="/srv/app")
    conf = configparser.RawConfigParser()
    conf.read_string(text)
    assert conf.get("supervisord", "nodaemon") == "true"
    for name, cmd in programs.items():
        section = f"program:{name}"
        assert conf.get(section, "autorestart") == "true"
        assert conf.get(section, "stopasgroup") == conf.get(section, "killasgroup") == "true"
        # supervisord turns %% back into %: the command it runs is exactly ours, behind
        # the guard that makes it die with supervisord (dynamic_batching/core/lifetime.py).
        guard, command = shlex.split(conf.get(section, "command").replace("%%", "%"))[:3], cmd
        assert guard[1:] == ["-m", "dynamic_batching.core.lifetime"]
        assert shlex.split(conf.get(section, "command").replace("%%", "%"))[3:] == command
    assert "collector@%%h" in conf.get("program:collector", "command")


def test_redis_syncs_its_append_only_file_as_redis_appendfsync_says(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    def fsync() -> str:
        cmd = processes.redis_server_command(6399, "/tmp/x", appendonly=True)
        return cmd[cmd.index("--appendfsync") + 1]

    monkeypatch.delenv("REDIS_APPENDFSYNC", raising=False)
    assert fsync() == "everysec"
    monkeypatch.setenv("REDIS_APPENDFSYNC", "always")
    assert fsync() == "always"
    monkeypatch.setenv("REDIS_APPENDFSYNC", "sometimes")
    with pytest.raises(SystemExit, match="set it to one of everysec, always"):
        fsync()


def test_make_runs_redis_has_a_password_kept_off_the_command_line_and_masked_when_printed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Issue 42, finding 8: make run's Redis had no password, and the banner printed
    # REDIS_URL with any password in it.
    import os
    import stat

    cmd = processes.redis_server_command(6399, str(tmp_path), appendonly=True, password="s3cret-pw")
    assert "s3cret-pw" not in " ".join(cmd), "a password on argv is visible to every local user (ps)"
    assert cmd.count(cmd[0]) == 1, cmd
    conf_file = cmd[1]
    assert (
        conf_file == str(tmp_path / "auth.conf") and (tmp_path / "auth.conf").read_text() == 'requirepass "s3cret-pw"\n'
    )
    assert stat.S_IMODE(os.stat(conf_file).st_mode) == 0o600
    assert processes.mask_url("redis://:s3cret-pw@127.0.0.1:6380/0") == "redis://:***@127.0.0.1:6380/0"
    assert processes.mask_url("rediss://user:pw@redis.internal:6379/1") == "rediss://user:***@redis.internal:6379/1"
    assert processes.mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
