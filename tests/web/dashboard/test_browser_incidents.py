"""The Incidents page as an operator uses it, in headless Chromium against a real Daphne (no
worker: the runs are made in the journal, and the batches wait for one): a group opens its
runs, and its batch starts from it through the batch confirmation, at 1280 px and at 390 px; a
viewer sees the groups without actions. Screenshots: ``var/test-artifacts/dashboard/
incidents-*.png``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from stateguard_web.sagas.models import AuditEvent, Batch, Run
from tests.web.api.world import make_user
from tests.web.conftest import Server
from tests.web.dashboard.test_browser import PASSWORD, PHONE, WIDE, log_in, shot
from tests.web.incident_world import incident

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

STRIPE_DOWN = ("Unexpected error communicating with Stripe. If this problem persists, let us "
               "know at support@stripe.com. (Network error: ConnectionRefusedError: "
               "[Errno 111] Connection refused)")


def fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"])


def group(page: Any, step: str) -> Any:
    return page.locator(f'li[data-incident][data-step="{step}"]')


def test_an_operator_opens_a_group_and_starts_its_batch(daphne: Server, browser: Any) -> None:
    make_user("olivia", "operator", password=PASSWORD)
    make_user("vera", "viewer", password=PASSWORD)
    now = timezone.now()
    down = [incident("checkout", "charge_user", "APIConnectionError", message=STRIPE_DOWN,
                     at=now - timedelta(minutes=17 * i + 3)) for i in range(37)]
    stuck = [incident("checkout", "book_hotel", "BookingFailed", status="needs_attention",
                      at=now - timedelta(hours=3 * i + 1), message="no room in Atlantis")
             for i in range(4)]
    incident("provision", "launch_instance", "ProvisioningFailed", message="disk full",
             at=now - timedelta(days=2))

    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, daphne.url)
    page.click("nav a[href='/incidents/']")
    page.wait_for_selector("li[data-incident]")
    assert page.locator("li[data-incident]").count() == 3
    first = page.locator("li[data-incident]").first
    assert " ".join(first.locator(".incident-title").inner_text().split()) == (
        "checkout failed at charge_user")
    assert first.locator(".incident-count").inner_text().split() == ["37", "runs"]
    assert "Stripe unreachable (connection refused)" in first.inner_text()
    assert first.locator("svg.spark rect.spark-bar").count() == 11  # 37 runs over 10.3 h
    page.wait_for_selector('#live-indicator[data-state="on"]')
    shot(page, "incidents-01-wide")

    # The group's runs: the list narrowed to it, kept in the URL.
    first.locator("a[data-runs-link]").click()
    page.wait_for_url("**/?status=failed&agent=checkout&step=charge_user"
                      "&error_type=APIConnectionError")
    assert page.locator("tr[data-run]").count() == 37
    assert "Runs that last failed at charge_user with APIConnectionError" in (
        page.locator("[data-narrowed]").inner_text())
    shot(page, "incidents-02-wide-runs")

    # Its batch: the same confirmation as any batch's, naming the group, then the batch.
    page.go_back()
    group(page, "charge_user").locator('a[data-batch="retry"]').click()
    page.wait_for_url("**/batches/new?**")
    assert page.locator("h1").inner_text() == "Retry 37 runs?"
    assert page.locator("[data-selection]").inner_text() == (
        "The runs of checkout that last failed at charge_user with APIConnectionError, "
        "failed now.")
    shot(page, "incidents-03-wide-confirm")
    page.click("form[action='/batches/'] button[type=submit]")
    page.wait_for_url("**/batches/*/")
    batch = Batch.objects.get(action="retry")
    assert sorted(batch.items.values_list("run_code", flat=True)) == sorted(r.code
                                                                            for r in down)
    assert len(AuditEvent.objects.get(action="batch.created").data["runs"]) == 37
    shot(page, "incidents-04-wide-batch")

    # At 390 px: the page fits, and the group that needs attention starts its batch too.
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.set_default_timeout(15_000)
    small.goto(daphne.url + "/incidents/")
    small.wait_for_selector("li[data-incident]")
    shot(small, "incidents-05-phone")
    assert fits(small)
    retry = group(small, "book_hotel").locator('a[data-batch="retry_compensations"]')
    assert retry.inner_text() == "Retry the compensations of 4 runs…"
    box = retry.bounding_box()
    assert box is not None and box["x"] + box["width"] <= PHONE["width"]
    retry.click()
    small.wait_for_url("**/batches/new?**")
    assert fits(small)
    assert small.locator("h1").inner_text() == "Retry failed compensations 4 runs?"
    shot(small, "incidents-06-phone-confirm")
    small.click("form[action='/batches/'] button[type=submit]")
    small.wait_for_url("**/batches/*/")
    assert fits(small)
    batch = Batch.objects.get(action="retry_compensations")
    assert batch.items.count() == 4 and set(batch.items.values_list("run_code", flat=True)) \
        == {r.code for r in stuck}
    shot(small, "incidents-07-phone-batch")
    phone.close()

    # A viewer sees the groups, and no action.
    viewing = browser.new_context(viewport=PHONE)
    seer = viewing.new_page()
    log_in(seer, daphne.url, "vera")
    seer.goto(daphne.url + "/incidents/")
    seer.wait_for_selector("li[data-incident]")
    assert seer.locator("li[data-incident]").count() == 3
    assert seer.locator("a[data-batch]").count() == 0 and fits(seer)
    shot(seer, "incidents-08-phone-viewer")
    viewing.close()
    context.close()
    assert Run.objects.filter(status="failed").count() == 38  # no worker: requested, waiting
