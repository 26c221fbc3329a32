"""The pages: /dashboard/ (login, Flower link, no CDN), /requests/<id> for each kind of
outcome, /requests/<id>.json, and /metrics in Prometheus' format."""

from __future__ import annotations

import re
import uuid

import pytest
from django.test import Client
from polling import poll_until
from prometheus_client.parser import text_string_to_metric_families

from dynamic_batching.edge.client import submit
from dynamic_batching.reporting import timeline

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user("operator", is_staff=True)


def wait_ready(result, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    poll_until(result.ready, f"request {result.id} to finish", timeout=timeout, interval=0.02)


# --- /dashboard/ ------------------------------------------------------------------------


def test_dashboard_needs_a_login(client: Client) -> None:
    response = client.get("/dashboard/")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=/dashboard/")


def test_dashboard_links_flower_from_settings_and_loads_nothing_from_outside(
    client, operator, batching_settings
) -> None:  # type: ignore[no-untyped-def]
    batching_settings(FLOWER_URL="https://flower.example.test/")
    client.force_login(operator)
    page = client.get("/dashboard/").content.decode()
    assert 'href="https://flower.example.test/"' in page
    assert "/api/v1/stats" in page and "/metrics" in page
    # The machine is offline and so may be an operator's: no script, style or font URL.
    assert not re.search(r"""(src|href)=["']https?://(?!flower\.example\.test)""", page)
    for element in ("stat-completed", "chart-depth", "chart-throughput", "slo-panel", "recent-failed", "devices"):
        assert f'id="{element}"' in page


# --- /requests/<id> --------------------------------------------------------------------------


def test_a_request_page_while_pending_refreshes_itself(admin_client: Client, bare_redis) -> None:  # type: ignore[no-untyped-def]
    page = admin_client.get(f"/requests/{uuid.uuid4()}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "PENDING" in html and 'http-equiv="refresh"' in html


def test_timeline_of_an_expired_request() -> None:
    events = timeline.timeline(
        "FAILURE",
        {"expired": True, "priority": "low"},
        done_at=10.0,
        error="DeadlineExceeded: request x was not dispatched before its deadline, so it never ran",
    )
    assert [e["event"] for e in events] == ["expired"] and "never ran" in events[0]["text"]


@pytest.mark.live
def test_request_pages_show_timeline_result_and_error(admin_client: Client, live_system) -> None:  # type: ignore[no-untyped-def]
    ok = submit("a request worth a page", priority="low", model="synthetic")
    bad = submit("this input is poison !fail", model="synthetic")
    ok.get(timeout=60)
    wait_ready(bad)

    html = admin_client.get(f"/requests/{ok.id}").content.decode()
    for event in ("submitted", "dispatched", "started", "finished"):
        assert f'data-event="{event}"' in html
    assert 'id="result"' in html and "floats" in html and "http-equiv" not in html
    details = ok.backend.get_task_meta(ok.id)["batching"]
    assert details["batch_id"] in html and details["device"] in html

    html = admin_client.get(f"/requests/{bad.id}").content.decode()
    assert 'id="error"' in html and "PoisonInput" in html and 'data-event="finished"' in html

    # The JSON view the submit page polls still answers as before.
    body = admin_client.get(f"/requests/{ok.id}.json").json()
    assert body["status"] == "SUCCESS" and body["details"]["priority"] == "low"


# --- /metrics -------------------------------------------------------------------------------------


def test_metrics_is_prometheus_text_without_global_registry_state(admin_client: Client, bare_redis) -> None:  # type: ignore[no-untyped-def]
    first = admin_client.get("/metrics")
    assert first.status_code == 200 and first["Content-Type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(first.content.decode())}
    assert {
        "batching_queue_depth",
        "batching_broker_queue_length",
        "batching_requests",
        "batching_wait_seconds",
        "batching_batch_size",
        "batching_batch_fill_ratio",
        "batching_batch_run_seconds",
        "batching_device_up",
        "batching_collector_up",
        "batching_redis_used_memory_bytes",
        "batching_redis_maxmemory_bytes",
    } <= names

    def steady(text: bytes) -> list[str]:
        """All but Redis' used memory, which moves between two scrapes by itself."""
        return [line for line in text.decode().splitlines() if not line.startswith("batching_redis_used_memory_bytes ")]

    # Built per scrape from Redis: a second scrape is the same text, not a re-registration error.
    assert steady(admin_client.get("/metrics").content) == steady(first.content)


def test_metrics_says_503_when_the_broker_is_down(admin_client: Client, unreachable_redis: None) -> None:
    assert admin_client.get("/metrics").status_code == 503
    assert admin_client.get(f"/requests/{uuid.uuid4()}").status_code == 503
