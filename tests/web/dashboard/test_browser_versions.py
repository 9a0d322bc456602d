"""Agent versions in headless Chromium against a real Daphne: the run page names the version
its run started on, and the agent's map lists its versions with their unfinished runs (the
runs are made in the journal, no worker). At 1280 and 390 px; screenshots ``versions-*.png``
beside test_browser.py's."""

from __future__ import annotations

from typing import Any

import pytest

from stateguard_web.runs import runtime
from stateguard_web.sagas.models import Run, Step
from tests.web.api.world import make_user
from tests.web.conftest import Server
from tests.web.dashboard.test_browser import PASSWORD, WIDE, log_in, phone_page, shot
from tests.web.test_agent_map import run

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def test_an_operator_sees_each_runs_version_and_which_versions_still_have_runs(
        daphne: Server, browser: Any) -> None:
    make_user("olivia", "operator", password=PASSWORD)
    digest = runtime.shape("checkout").digest  # the server's too: the same in every process
    on_v1 = run("checkout", Run.Status.PAUSED, ("create_customer", Step.Status.SUCCEEDED))
    held = run("checkout", Run.Status.NEEDS_ATTENTION, ("create_customer", "succeeded"))
    Run.objects.filter(pk=on_v1.pk).update(agent_version="1", graph_digest=digest)
    Run.objects.filter(pk=held.pk).update(agent_version="0", graph_digest="0123456789abcdef")
    run("checkout", Run.Status.SUCCEEDED)  # finished on v1: not counted
    Run.objects.filter(status=Run.Status.SUCCEEDED).update(agent_version="1",
                                                           graph_digest=digest)

    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    log_in(page, daphne.url)
    page.goto(f"{daphne.url}/runs/{on_v1.code}/")
    assert page.locator("[data-agent-version]").inner_text() == "agent version v1"
    assert page.locator("[data-agent-version] strong").get_attribute("title").endswith(digest)
    shot(page, "versions-run-wide")

    page.goto(f"{daphne.url}/agents/checkout/map")
    rows = page.locator(".versions-table tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.version, r.dataset.state, "
        "r.querySelector('td.num').textContent])")
    assert rows == [["v1", "current", "1"], ["v0", "gone", "1"]]
    shot(page, "versions-map-wide")

    phone, small = phone_page(browser, context, f"{daphne.url}/agents/checkout/map",
                              ".versions-table")
    shot(small, "versions-map-phone")
    small.goto(f"{daphne.url}/runs/{held.code}/")
    small.wait_for_selector("[data-agent-version='v0']")
    assert small.evaluate("document.documentElement.scrollWidth") <= 390
    shot(small, "versions-run-phone")
    phone.close()
    context.close()
