"""A run's webhook deliveries on its page, in headless Chromium against a real Daphne, at 1280
and 390 px: one delivered on its second try after a 500, one waiting after a timeout.
Screenshots: ``var/test-artifacts/dashboard/webhooks-*.png``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from stateguard_web.accounts import services as accounts
from stateguard_web.sagas.models import Run
from stateguard_web.webhooks.models import Delivery, RunWebhook
from tests.web.conftest import Server
from tests.web.dashboard.conftest import ARTIFACTS
from tests.web.dashboard.test_browser import (  # noqa: F401  (people: a fixture)
    PASSWORD,
    PHONE,
    WIDE,
    people,
    shot,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def journal(shop: Any) -> Run:
    key, _ = accounts.api_key_create(user=shop, name="shop-bot")
    run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATED, submitted_by=shop,
                             input={"email": "a@b.co", "amount": 4200})
    RunWebhook.objects.create(run=run, url="https://hooks.shop.example/stateguard", key=key)
    t0 = timezone.now() - timedelta(minutes=3)
    first = Delivery.objects.create(event_id="evt_" + "a" * 32, run=run, type="run.failed",
                                    status="delivered", attempts=2, created_at=t0,
                                    delivered_at=t0 + timedelta(seconds=31))
    first.tries.create(number=1, url=run.webhook.url, started_at=t0, duration_ms=84,
                       status_code=500, response='{"error": "database is down"}')
    first.tries.create(number=2, url=run.webhook.url, started_at=t0 + timedelta(seconds=31),
                       duration_ms=12, status_code=204)
    later = t0 + timedelta(minutes=2)
    second = Delivery.objects.create(event_id="evt_" + "b" * 32, run=run,
                                     type="run.compensated", attempts=1, created_at=later,
                                     next_attempt_at=timezone.now() + timedelta(seconds=50))
    second.tries.create(number=1, url=run.webhook.url, started_at=later, duration_ms=5003,
                        error="ReadTimeout: timed out")
    return run


def test_a_runs_page_shows_its_webhook_deliveries_on_a_desk_and_a_phone(
        daphne: Server, browser: Any, people: dict[str, Any]) -> None:  # noqa: F811
    run = journal(people["shop"])
    for name, viewport in (("wide", WIDE), ("phone", PHONE)):
        context = browser.new_context(viewport=viewport)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(daphne.url + "/login/")
        page.fill("#id_username", "olivia")
        page.fill("#id_password", PASSWORD)
        page.click("form button[type=submit]")
        page.wait_for_url(daphne.url + "/")
        page.goto(f"{daphne.url}/runs/{run.code}/")
        panel = page.locator("[data-webhooks]")
        panel.scroll_into_view_if_needed()
        assert "hooks.shop.example" in panel.inner_text()
        delivered = page.locator('[data-delivery][data-state="delivered"]')
        waiting = page.locator('[data-delivery][data-state="pending"]')
        assert delivered.get_attribute("open") is None  # folded: nothing to look at
        assert waiting.get_attribute("open") is not None
        assert "ReadTimeout" in waiting.inner_text() and "5003 ms" in waiting.inner_text()
        delivered.locator("summary").click()
        assert "database is down" in delivered.inner_text()
        # Nothing wider than the screen (the page does not scroll sideways on a phone).
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        panel.screenshot(path=str(ARTIFACTS / f"webhooks-{name}.png"))
        shot(page, f"webhooks-page-{name}")
        context.close()
