"""A refund from a run's page, as an operator makes one (issue 18, item 23): in headless Chromium
against a real Daphne, a real worker and localstripe, set up as ``test_browser`` does, with a
``StripeProxy`` between the app and localstripe. The shop submits a checkout that a worker
charges; the operator opens the run, clicks the ledger's "Refund…", is told what each bad
amount is wrong with, refunds a part while Stripe is slow to answer and clicks again meanwhile
(one refund), then the rest from a phone; a viewer sees no action and a forged POST of theirs
is refused. Screenshots: ``var/test-artifacts/dashboard/refund-*.png``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe

from stateguard_web.sagas.models import AuditEvent, Run
from tests.conftest import STRIPE_TEST_KEY
from tests.web.api.test_end_to_end import Server
from tests.web.conftest import Workers
from tests.web.dashboard.conftest import ARTIFACTS
from tests.web.dashboard.test_browser import (  # noqa: F401  (people: a fixture)
    PHONE,
    WIDE,
    log_in,
    operator_page,
    people,
    run_status,
    shot,
    submit,
)
from tests.web.payments.world import StripeProxy, refunded_at_stripe, refunds_at_stripe

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

BAD_AMOUNTS = [("0", "The amount must be at least 1."),
               ("-5", "The amount must be at least 1."),
               ("4201", "At most 4200 (42.00 USD) remains to be refunded of"),
               ("12,5", "The amount must be a whole number (cents)."),
               ("abc", "The amount must be a whole number (cents).")]


@pytest.fixture
def stack(workers: Workers, localstripe_url: str, tmp_path: Path
          ) -> Iterator[tuple[Server, StripeProxy]]:
    """``test_end_to_end.stack`` with a ``StripeProxy`` between the app and localstripe."""
    with StripeProxy(localstripe_url) as proxy:
        workers.env.update(STRIPE_API_BASE=proxy.url, STRIPE_API_KEY=STRIPE_TEST_KEY,
                           STATEGUARD_ENV_FILE="")
        workers.start("w1")
        server = Server(workers.env, tmp_path / "daphne.log")
        try:
            server.wait_until_up()
            yield server, proxy
        finally:
            server.stop()


def fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"])


def confirm(page: Any, amount: str, reason: str) -> None:
    """Fill the refund's form and send it, waiting for the page that answers."""
    page.fill("#id_amount", amount)
    page.fill("#id_reason", reason)
    with page.expect_navigation():
        page.click("#refund-form button[type=submit]")


def test_it_lets_an_operator_refund_a_charge_from_the_run_page(
        stack: tuple[Server, StripeProxy], workers: Workers, browser: Any,
        people: dict[str, Any], publisher: None,  # noqa: F811
        stripe_client: stripe.StripeClient) -> None:
    server, proxy = stack
    url = server.url
    context, page, logs = operator_page(browser, server, workers)
    run = submit("checkout", people["shop"], email="mug@shop.test", amount=42_00)
    page.goto(f"{url}/runs/{run.code}/")
    run_status(page, "succeeded", logs)
    page.wait_for_selector("a[data-refund]")
    intent = page.locator("a[data-refund]").get_attribute("data-refund")
    assert intent is not None and intent.startswith("pi_")
    shot(page, "refund-01-run-ledger")

    page.click("a[data-refund]")
    page.wait_for_url(f"**/runs/{run.code}/effects/*/refund")
    refund_path = page.evaluate("location.pathname")
    assert page.locator("dd.charged").inner_text() == "42.00 USD (4200)"
    assert page.locator("dd.remaining").inner_text() == "42.00 USD (4200)"
    assert page.locator("[name=resolve]").count() == 0  # the run does not need attention
    shot(page, "refund-02-confirm")

    # Every bad amount is answered on the page, next to the field, and refunds nothing.
    for i, (amount, said) in enumerate(BAD_AMOUNTS):
        confirm(page, amount, "a chipped mug")
        assert said in page.locator(".field-amount .field-errors").inner_text(), amount
        assert page.input_value("#id_amount") == amount
        if i in (0, 2):
            shot(page, f"refund-03-bad-amount-{amount}")
    assert refunds_at_stripe(stripe_client, intent) == []

    # Stripe is slow to answer the refund, and the operator clicks "Refund" again meanwhile:
    # the browser sends it once, and the run's page then says what was refunded.
    slow = proxy.held[("POST", "/v1/refunds")] = threading.Event()
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.fill("#id_amount", "1500")
    page.fill("#id_reason", "a chipped mug")
    button = page.locator("#refund-form button[type=submit]").bounding_box()
    assert button is not None
    at = (button["x"] + button["width"] / 2, button["y"] + button["height"] / 2)
    # The mouse, not page.click: the page that a click leads to waits for Stripe, which
    # waits for this test, and Playwright's clicks wait for that page.
    page.mouse.click(*at)
    assert proxy.arrived.wait(30), logs()[-4000:]  # the refund is at "Stripe" now
    page.mouse.click(*at)  # the second click, on the page still shown
    slow.set()
    page.wait_for_url(f"**/runs/{run.code}/")
    assert [p.split("?")[0] for p in posts] == [url + refund_path]
    success = page.locator(".message-success").inner_text()
    (made,) = refunds_at_stripe(stripe_client, intent)
    assert success == f"Refunded 15.00 USD of {intent} (Stripe refund {made.id})."
    assert made.amount == 1500 and refunded_at_stripe(stripe_client, intent) == 1500
    assert "partly compensated" in page.locator('[data-effect="charge"] .badge').inner_text()
    assert page.locator('[data-effect="refund"]').count() == 1
    assert page.locator("a[data-refund]").count() == 1  # 27.00 USD remain
    shot(page, "refund-04-partly-refunded")

    # A viewer sees the ledger with no action; a POST forged with their own session and CSRF
    # token is refused and refunds nothing.
    viewing = browser.new_context(viewport=WIDE)
    seer = viewing.new_page()
    log_in(seer, url, "vera")
    seer.goto(f"{url}/runs/{run.code}/")
    seer.wait_for_selector('[data-effect="refund"]')
    assert seer.locator("a[data-refund]").count() == 0
    shot(seer, "refund-05-viewer-ledger")
    status = seer.evaluate("""async (path) => {
        const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
        const body = new URLSearchParams({csrfmiddlewaretoken: token, reason: "forged"});
        const answer = await fetch(path, {method: "POST", body, redirect: "manual"});
        return answer.status;
    }""", refund_path)
    assert status == 403
    assert len(refunds_at_stripe(stripe_client, intent)) == 1
    viewing.close()

    # The rest, from a phone: the run's page and the confirmation fit 390 px.
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(f"{url}/runs/{run.code}/")
    small.wait_for_selector("a[data-refund]")
    assert fits(small)
    box = small.locator("a[data-refund]").bounding_box()  # in sight, not scrolled off in the table
    assert box is not None and box["x"] + box["width"] <= PHONE["width"]
    small.locator("#effects-h").scroll_into_view_if_needed()
    small.screenshot(path=str(ARTIFACTS / "refund-06-phone-ledger.png"))  # where it is
    small.click("a[data-refund]")
    small.wait_for_url(f"**{refund_path}")
    assert fits(small)
    assert small.locator("dd.remaining").inner_text() == "27.00 USD (2700)"
    shot(small, "refund-07-phone-confirm")
    confirm(small, "", "the customer sent the mug back")
    small.wait_for_url(f"**/runs/{run.code}/")
    assert small.locator(".message-success").inner_text().startswith("Refunded 27.00 USD of ")
    assert refunded_at_stripe(stripe_client, intent) == 4200
    assert len(refunds_at_stripe(stripe_client, intent)) == 2
    assert small.locator("a[data-refund]").count() == 0
    badge = small.locator('[data-effect="charge"] .badge').inner_text().strip()
    assert badge.endswith("compensated")
    assert fits(small)
    shot(small, "refund-08-phone-refunded")
    phone.close()

    refunded = AuditEvent.objects.filter(run=run, action="effect.refunded").order_by("pk")
    assert list(refunded.values_list("actor", "data__amount")) == [("olivia", 1500),
                                                                    ("olivia", 2700)]
    assert Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED
    context.close()
