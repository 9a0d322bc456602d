"""Hostile input as an operator sees it, in headless Chromium against a real Daphne (no worker:
these runs are made in the journal): bidi controls in a run's input, its submitter's name and
its error are shown as markers, not obeyed; and the browser's own websocket hears the app's
close codes for a bad frame. Screenshots go beside test_browser.py's."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from stateguard_web.sagas.models import Run
from tests.web.api.world import make_user
from tests.web.conftest import Server
from tests.web.dashboard.test_browser import (
    PASSWORD,
    PHONE,
    WIDE,
    live,
    log_in,
    shot,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

RLO = "\u202e"
# What a spoofer hopes the list shows: "...paid-in-full.exe" reads "...exe.lluf-ni-diap".
SPOOF = f"refund {RLO}exe.lluf-ni-diap"

CLOSE_CODE = """async ([path, frame]) => await new Promise((resolve) => {
  const ws = new WebSocket("ws://" + location.host + path);
  ws.onopen = () => ws.send(frame);
  ws.onclose = (event) => resolve(event.code);
})"""


def test_an_operator_sees_bidi_controls_as_markers_in_the_list_and_the_run(
        daphne: Server, browser: Any) -> None:
    make_user("olivia", "operator", password=PASSWORD)
    mallory = make_user(f"mallory{RLO}", "submitter")
    spoofed = Run.objects.create(
        agent="checkout", status=Run.Status.NEEDS_ATTENTION, submitted_by=mallory,
        input={"email": f"m{RLO}@evil.test", "amount": 100, "note": SPOOF},
        error={"type": "BookingFailed", "message": f"no room: {SPOOF}", "traceback": ""},
        updated_at=timezone.now())
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, daphne.url)
    live(page)

    row = page.locator(f"#run-{spoofed.code}")
    text = row.inner_text()
    assert RLO not in text
    assert "malloryU+202E" in text  # the name, its control marked
    assert "refund \\u202eexe.lluf-ni-diap" in text  # the input, as JSON escapes it
    assert row.locator("bdi .ctrl").get_attribute("title") == "RIGHT-TO-LEFT OVERRIDE"
    shot(page, "21-hidden-characters-runs")

    page.click(f"#run-{spoofed.code} a.run-link")
    page.wait_for_url(f"**/runs/{spoofed.code}/")
    live(page)
    error = page.locator(".error-summary").first.inner_text()
    assert error == "BookingFailed: no room: refund U+202Eexe.lluf-ni-diap"
    assert RLO not in page.locator("main").inner_text()
    shot(page, "22-hidden-characters-run")

    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(daphne.url + "/")
    small.wait_for_selector(f"#run-{spoofed.code}")
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert RLO not in small.locator("main").inner_text()
    shot(small, "23-phone-hidden-characters-runs")
    small.goto(f"{daphne.url}/runs/{spoofed.code}/")
    live(small)
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert "submitted by malloryU+202E" in small.locator(".run-head").inner_text()
    shot(small, "24-phone-hidden-characters-run")

    # The browser's own websocket: a bad frame closes it with the app's code, as sent.
    assert small.evaluate(CLOSE_CODE, ["/ws/runs/", "not json {"]) == 4003
    assert small.evaluate(CLOSE_CODE, ["/ws/runs/", '{"type": "ping", "x": "' + "x" * 2000
                                       + '"}']) == 4009
    phone.close()
    context.close()
    assert "Traceback" not in daphne.logs()
