"""Fixtures for tests that need the real thing: a Redis-compatible server started on a
free port, and real collector and device-worker processes talking to it."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator

import pytest
from polling import poll_until

from dynamic_batching.conf import conf
from dynamic_batching.store.connection import connect

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _forget_refusals() -> Iterator[None]:
    """Each test's callers start unrefused: the web's memory of who was just refused
    (tasks/web/access.py, batching_site/logins.py) is per process, and owner names
    ("user:<pk>") come back in every test's database."""
    yield
    from batching_site import logins
    from dynamic_batching.web import access

    access.refusals.clear()
    logins._locked.clear()
    logins._strikes.clear()


@pytest.fixture
def unreachable_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process pointed at a Redis address where nothing listens, for a test of
    what callers see with the broker down. The clients made for it give up after about
    a second instead of retrying for RETRY_FOR_S (20 s, long enough for a restart),
    which is the behaviour under test, only sooner: the two tests that used it waited
    out the full retries, 75 s and 56 s."""
    from batching_site.harness import free_port
    from dynamic_batching.store import connection

    monkeypatch.setattr(connection, "RETRY_FOR_S", 1.0)
    previous = conf.REDIS_URL
    connect(f"redis://127.0.0.1:{free_port()}/0")
    try:
        yield
    finally:
        connect(previous)


@pytest.fixture(scope="session")
def live_system() -> Iterator[object]:
    """Redis, the collector and two simulated CPU devices, with both models loaded."""
    from batching_site.harness import LocalSystem

    system = LocalSystem(
        devices=["cpu:0", "cpu:1"],
        preload="synthetic,minilm",
        env={"TORCH_THREADS": "1", "SYNTHETIC_PER_TOKEN_S": "0.00005"},
    )
    try:
        system.start(timeout=180)
        assert system.redis_url
        connect(system.redis_url)
        yield system
    finally:
        system.close()


@pytest.fixture
def bare_redis() -> Iterator[object]:
    """A Redis with no collector or device worker behind it, this process pointed at it
    for one test: what is submitted stays queued. Points back where it was afterwards."""

    from batching_site.celery import app
    from batching_site.harness import LocalSystem

    previous = conf.REDIS_URL
    system = LocalSystem()
    try:
        system.start_redis()
        assert system.redis_url
        connect(system.redis_url)
        yield system
    finally:
        # AsyncResults made here unsubscribe from their result keys when collected; on
        # a server that is gone, Celery retries that for 20 s. Make them forget it.
        consumer = getattr(app._local.__dict__.get("backend"), "result_consumer", None)
        if consumer is not None:
            forget_subscriptions(consumer)
        connect(previous)
        system.close()


def forget_subscriptions(consumer: object) -> None:
    """A Celery result consumer that no longer speaks to its Redis: an AsyncResult made
    through it, when collected, unsubscribes through it, and on a server that is gone
    Celery retries that for minutes (its retries, each one redis-py's)."""
    consumer.stop()  # type: ignore[attr-defined]
    consumer._pubsub = None  # type: ignore[attr-defined]
    consumer.subscribed_to.clear()  # type: ignore[attr-defined]
    consumer.cancel_for = lambda task_id: None  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every Redis the tests started is gone by now: AsyncResults still to be collected
    must not try to unsubscribe on them. One collected while schemathesis' own session
    end imported a module held an xdist worker for over five minutes in a fresh-clone
    make test."""
    import gc

    from celery.backends.redis import ResultConsumer

    # By type(), not isinstance: that reads __class__, which some of torch's objects warn on.
    for consumer in [o for o in gc.get_objects() if issubclass(type(o), ResultConsumer)]:
        forget_subscriptions(consumer)
    gc.collect()


@pytest.fixture
def bare_runner() -> Iterator[object]:
    """A DeviceRunner on its own Redis (no collector, no other device), so its
    heartbeat and outcomes touch nothing else."""

    from batching_site.celery import app
    from batching_site.harness import LocalSystem
    from dynamic_batching.gpu_workers.runner import DeviceRunner

    previous = conf.REDIS_URL
    system = LocalSystem()
    runner = None
    try:
        system.start_redis()
        assert system.redis_url
        connect(system.redis_url)
        runner = DeviceRunner(app, "cpu:7", preload=())
        yield runner
    finally:
        if runner is not None:
            runner.close()
        system.close()
        connect(previous)


@pytest.fixture
def redis_client(live_system: object):  # type: ignore[no-untyped-def]
    from dynamic_batching.store import shared_state

    return shared_state.client()


def apply_policy(policy: object, *, timeout: float = 5.0) -> object:
    """Publish `policy` under a fresh version, wait until the running collector's
    heartbeat shows that version, and make this process's client read it at once.
    Returns the policy as published."""
    from dynamic_batching.edge import client
    from dynamic_batching.store import shared_state

    current = shared_state.read_collector() or {}
    version = max(shared_state.read_policy().version, int(current.get("policy_version") or 0)) + 1
    published = policy.evolve(version=version)  # type: ignore[attr-defined]
    shared_state.publish_policy(published)
    client._policy._read_at = float("-inf")
    wait_for_collector_policy(version, timeout=timeout)
    return published


def wait_for_collector_policy(version: int, *, timeout: float = 5.0) -> float:
    """Poll the collector heartbeat until it runs `version`; returns when it did
    (time.monotonic()), or fails the test after `timeout` seconds."""
    import time

    from dynamic_batching.store import shared_state

    poll_until(
        lambda: (shared_state.read_collector() or {}).get("policy_version") == version,
        f"the collector to apply policy version {version}",
        timeout=timeout,
    )
    return time.monotonic()


@pytest.fixture
def restore_policy(live_system: object) -> Iterator[None]:
    """The live system is shared by every test file: put the default policy back after
    a test that changes it, and wait until the collector runs it again."""
    yield
    from dynamic_batching.core.policy import BatchPolicy
    from dynamic_batching.edge import client
    from dynamic_batching.store import shared_state

    shared_state.publish_policy(BatchPolicy())
    client._policy._read_at = float("-inf")
    wait_for_collector_policy(0)


@pytest.fixture
def threads_not_lingering() -> Iterator[None]:
    """Fail the test if it leaves a non-daemon or batcher ("batch-*") thread alive,
    like Celery's own guard fixture."""
    before = set(threading.enumerate())
    yield
    lingering = []
    for t in threading.enumerate():
        if t in before or t is threading.current_thread():
            continue
        if not t.daemon or t.name.startswith("batch-"):
            t.join(1.0)  # bounded grace for a thread that is just returning
            if t.is_alive():
                lingering.append(t.name)
    assert not lingering, f"threads still alive after the test: {lingering}"


@pytest.fixture
def batching_settings(settings, monkeypatch):  # type: ignore[no-untyped-def]
    """`batching_settings(KEY=value, ...)` sets keys of the BATCHING dict for one test,
    with their BATCHING_<KEY> variables unset (the environment wins over the dict)."""

    from dynamic_batching.conf import conf

    def set_(**values: object) -> None:
        for key in values:
            monkeypatch.delenv("BATCHING_" + key, raising=False)
        # And above both, this process's own overrides (connect() sets REDIS_URL).
        monkeypatch.setattr(conf, "_overrides", {k: v for k, v in conf._overrides.items() if k not in values})
        settings.BATCHING = {**getattr(settings, "BATCHING", {}), **values}

    return set_


#: A skip that says `make test` installs what it lacks. On CI, where `make test` ran
#: and installed it, such a skip means the install failed: a failure, not a pass.
_REQUIRED_TOOL = re.compile(r"make test (does it|installs)|`apt-get install")


def required_tool_missing(reason: str, environ: dict[str, str] | os._Environ[str]) -> bool:
    return bool(environ.get("CI")) and _REQUIRED_TOOL.search(reason) is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and required_tool_missing(str(report.longrepr), os.environ):
        report.outcome = "failed"
        report.longrepr = f"a tool `make test` installs is missing on CI: {report.longrepr}"
