"""The workers page in headless Chromium (issue 23 §1), against a real Daphne and a real
Celery worker whose heartbeats say who it is, set up as ``test_browser`` does.

An operator opens the page at 1280 px: the worker, alive, holds the slow run it is running;
the queue's tiles count the pending runs and the oldest one's wait, which is past the
threshold, so every page's header warns that the queue is behind; the chart draws the last
hour. When the run ends, the page drops it from the worker's runs by itself (no reload). A
viewer sees the same at 390 px, with no action. Screenshots: ``workers-*.png`` in
``var/test-artifacts/dashboard/``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from stateguard_web.sagas.models import Run
from tests.web.api.test_end_to_end import Server
from tests.web.conftest import Workers
from tests.web.dashboard.test_browser import (  # noqa: F401  (people: a fixture)
    PHONE,
    WIDE,
    live,
    log_in,
    not_reloaded,
    operator_page,
    people,
    shot,
    stack,
    submit,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def a_backlog_and_an_hour(shop: Any) -> list[Run]:
    """Three runs pending for 6 to 8 minutes (made here, so no message of theirs waits in the
    queue and the worker leaves them be), and what finished in the last hour, for the chart."""
    now = timezone.now()
    pending = []
    for minutes in (8, 7, 6):
        run = Run.objects.create(agent="provision", input={"name": f"queued-{minutes}"},
                                 submitted_by=shop)
        Run.objects.filter(pk=run.pk).update(created_at=now - timedelta(minutes=minutes))
        pending.append(run)
    for i in range(24):
        at = now - timedelta(minutes=50 - 2 * i)
        status = (Run.Status.SUCCEEDED, Run.Status.SUCCEEDED, Run.Status.COMPENSATED,
                  Run.Status.NEEDS_ATTENTION)[i % 4]
        run = Run.objects.create(agent="checkout", status=status, submitted_by=shop,
                                 started_at=at, finished_at=at + timedelta(seconds=20))
        Run.objects.filter(pk=run.pk).update(created_at=at - timedelta(seconds=30))
    return pending


def fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"])


def test_it_shows_workers_and_the_queue_live_to_an_operator_and_a_viewer(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None) -> None:  # noqa: F811
    shop = people["shop"]
    pending = a_backlog_and_an_hour(shop)
    slow = submit("provision", shop, name="web-slow", sleep_at="create_group",
                  sleep_seconds=4)
    context, page, logs = operator_page(browser, stack, workers)

    # The header of every page says the queue is behind (the oldest has waited 8 min).
    warning = page.locator("[data-backlog]")
    assert "The queue is behind: the oldest pending run has waited 8 min" in " ".join(
        warning.inner_text().split())
    # The page's re-reads on the slow run's events move the age in place: the banner and its
    # link stay the elements they were, so that a click on the link is not lost in a swap.
    # (Once the slow run has started: its start takes it out of the pending, a real change.)
    page.wait_for_function("() => document.querySelector('[data-pending-count]').textContent"
                           " === '3'", timeout=15_000)
    warning.evaluate("el => { el.kept = true; }")  # a property: not in its markup
    age = page.locator("[data-backlog-age]").inner_text()
    page.wait_for_function("age => document.querySelector('[data-backlog-age]').textContent"
                           " !== age", arg=age, timeout=15_000)
    assert warning.evaluate("el => el.kept === true")
    page.click("[data-backlog] a")
    page.wait_for_url("**/workers/")
    live(page)
    row = page.locator("tr[data-worker^='w1@']")
    assert row.get_attribute("data-alive") == "true"
    page.wait_for_selector(f"tr[data-worker^='w1@'] a[href='/runs/{slow.code}/']",
                           timeout=15_000)  # the run its process holds now
    assert page.locator("[data-pending]").inner_text() == "3"
    assert page.locator("[data-oldest-age]").inner_text().startswith("8 min")
    assert page.locator(".tile-warn [href]").get_attribute("href") == f"/runs/{pending[0].code}/"
    assert page.locator("[data-alive-count]").inner_text() == "1"
    assert page.locator("svg.chart polyline").count() == 5
    legend = " ".join(page.locator(".chart-legend").inner_text().split())
    assert "succeeded 12" in legend and "compensated 6" in legend, legend
    assert "needing attention 6" in legend and "started 25" in legend, legend
    shot(page, "workers-01-operator-run-held")

    # The run ends: the worker holds nothing more, and the page says so by itself.
    page.wait_for_selector("tr[data-worker^='w1@'] [data-held='0']", timeout=30_000)
    assert Run.objects.get(pk=slow.pk).status == Run.Status.SUCCEEDED, logs()[-4000:]
    assert not_reloaded(page)
    page.click("#chart-numbers summary")
    shot(page, "workers-02-operator-idle-numbers")
    context.close()

    # A viewer, on a phone: the same page, no action, nothing wider than the screen.
    phone = browser.new_context(viewport=PHONE)
    seer = phone.new_page()
    seer.set_default_timeout(15_000)
    log_in(seer, stack.url, "vera")
    seer.click("nav a[href='/workers/']")
    seer.wait_for_url("**/workers/")
    seer.wait_for_selector("tr[data-worker^='w1@'][data-alive='true']")
    assert fits(seer)
    assert seer.locator("main button, main form, main input").count() == 0
    assert seer.locator("[data-backlog]").is_visible()
    box = seer.locator("svg.chart").bounding_box()
    assert box is not None and box["width"] <= PHONE["width"] and box["height"] > 100
    shot(seer, "workers-03-viewer-phone")
    phone.close()
    assert WIDE["width"] == 1280
