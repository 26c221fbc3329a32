"""A real browser: Debian's chromium, headless, driven by playwright.

It logs in through the site's login form, submits a text from `/`, sees the result
and follows it to the request's timeline, then watches the dashboard's counters move
without reloading the page. The web server is pytest-django's `live_server` (a real
HTTP server in a thread of this process) talking to the live system's Redis.

`make test` installs chromium when it is missing (apt). Elsewhere the test skips,
saying why. It never downloads a browser of its own: `playwright install` is not used.
Set BROWSER_SCREENSHOTS=DIR to keep screenshots of the pages it saw.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import launched

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    # Playwright's sync API keeps an event loop running in this thread, and Django then
    # refuses database calls here (the test's own, and the test database's flush).
    # They are plain synchronous calls, so tell Django, as playwright's docs advise.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with launched() as b:
            yield b
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def counter(page, name: str) -> int:  # type: ignore[no-untyped-def]
    text = page.inner_text(f"#stat-{name}")
    digits = re.sub(r"[^\d]", "", text)
    return int(digits) if digits else -1


def shoot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    folder = os.environ.get("BROWSER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def wait_for(page, expression: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    """Poll `expression` in the page until it is true. Not Playwright's
    wait_for_function, which evaluates its predicate with eval(), which the site's
    Content-Security-Policy (rightly) refuses."""
    import time

    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"not true within {timeout} s: {expression}"
        page.wait_for_timeout(100)


def test_submit_from_the_page_then_watch_the_dashboard_move(
    live_system, live_server, browser, django_user_model
) -> None:  # type: ignore[no-untyped-def]
    django_user_model.objects.create_user("operator", password="a-test-only-password-9", is_staff=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    # The pages run under the site's Content-Security-Policy; anything it blocks is
    # reported on the console (issue 42, finding 10).
    blocked: list[str] = []
    context.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    try:
        dash = context.new_page()
        # The dashboard needs a login: it sends us to the site's login form.
        dash.goto(f"{live_server.url}/dashboard/")
        assert "/login/" in dash.url
        dash.fill("#id_username", "operator")
        dash.fill("#id_password", "a-test-only-password-9")
        dash.click("#login-button")
        dash.wait_for_url(re.compile(r".*/dashboard/$"))
        wait_for(dash, "Number(document.body.dataset.updates || 0) >= 1")
        assert dash.inner_text("#conn") == "live"
        before = counter(dash, "completed")
        assert before >= 0

        page = context.new_page()
        page.goto(f"{live_server.url}/")
        page.select_option("#model", "minilm")
        page.fill("#input", "a sentence typed into a real browser")
        # A quota's highest tier (users and staff: normal unless the admin says more)
        # bounds what the page offers.
        assert page.eval_on_selector_all("#priority option", "os => os.map(o => o.value)") == ["normal", "low"]
        page.select_option("#priority", "normal")
        page.click("#submit-button")
        page.wait_for_selector("#status.ok")
        status = page.inner_text("#status")
        assert status.startswith("SUCCESS") and "384 floats" in status, status
        shoot(page, "submit")

        page.click("#timeline-link")
        page.wait_for_selector("#timeline li[data-event=finished]")
        events = page.eval_on_selector_all("#timeline li", "lis => lis.map(li => li.dataset.event)")
        assert events == ["submitted", "dispatched", "started", "finished"]
        assert "384 floats" in page.inner_text("#result")
        shoot(page, "request")

        # Without a reload, the dashboard's counter takes in the new completion.
        dash.bring_to_front()
        wait_for(dash, f"Number(document.getElementById('stat-completed').textContent.replace(/\\D/g, '')) > {before}")
        assert dash.evaluate("performance.getEntriesByType('navigation').length") == 1  # never reloaded
        assert counter(dash, "completed") > before
        dash.wait_for_selector("#devices .dot.up")
        assert dash.get_attribute("#flower-link", "href")
        assert dash.locator("#slo-checks .slo").count() >= 5
        assert dash.locator("#chart-depth path").count() >= 1  # the series has points by now
        # The collector learned what a batch costs from the batch that just ran.
        wait_for(dash, "document.getElementById('batch-costs').textContent.startsWith('batch cost (learned)')")
        shoot(dash, "dashboard")
        assert blocked == [], f"the Content-Security-Policy blocked: {blocked}"
    finally:
        context.close()
