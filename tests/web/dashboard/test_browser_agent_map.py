"""An agent's map in headless Chromium against a real Daphne (no worker: the runs are made in
the journal), as a viewer, who sees it and has nothing to act on: the travel agent's graph with
its tools under the tools node, counts and colours per node, live as a run fails; a click on a
node opens the runs stopped there. At 1280 and 390 px. Screenshots beside test_browser.py's:
``agent-map-*.png``."""

from __future__ import annotations

from typing import Any

import pytest

from stateguard_web.sagas import events
from stateguard_web.sagas.models import Approval, Run, Step
from tests.web.api.world import make_user
from tests.web.conftest import Server
from tests.web.dashboard.test_browser import (
    PASSWORD,
    WIDE,
    live,
    not_reloaded,
    phone_page,
    shot,
)
from tests.web.test_agent_map import run

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

S, R, A = Step.Status, Run.Status, Approval.Status


def node_text(page: Any, node: str) -> str:
    """What the node's box says (its lines, not its tooltip)."""
    lines = page.locator(f'svg [data-node="{node}"] text').all_text_contents()
    return " ".join(" ".join(lines).split())


def test_a_viewer_reads_the_travel_agents_map_live_and_opens_a_nodes_runs(
        daphne: Server, browser: Any, publisher: None) -> None:
    make_user("vera", "viewer", password=PASSWORD)
    ok = ("agent", S.SUCCEEDED)
    run("travel", R.RUNNING, ok, ("tools", S.STARTED), ("charge_card", S.STARTED))
    run("travel", R.PAUSED, ok, ("tools", S.PAUSED), approvals=(("charge_card", A.PENDING),))
    failed = run("travel", R.FAILED, ok, ("reserve_hotel", S.FAILED), ("tools", S.FAILED))
    run("travel", R.COMPENSATED, ok, ("reserve_hotel", S.FAILED), ("tools", S.FAILED))
    for _ in range(6):
        run("travel", R.SUCCEEDED, ok, ("tools", S.SUCCEEDED), ("send_confirmation",
                                                                 S.SUCCEEDED))

    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{daphne.url}/login/?next=/agents/travel/map%3Fwindow%3D1h")
    page.fill("#id_username", "vera")
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url("**/agents/travel/map?window=1h")
    live(page)

    # The graph as the run page draws it, the tools under the tools node, each with its counts.
    nodes = page.locator("svg.graph [data-node]").evaluate_all(
        "els => els.map(e => e.dataset.node)")
    assert nodes == ["agent", "tools", "charge_card", "reserve_hotel", "send_confirmation"]
    assert node_text(page, "reserve_hotel") == "reserve_hotel ✕ 1 ↩ 1 20.0 % failed here"
    assert node_text(page, "charge_card") == "charge_card ▶ ● 1 ‖ 1 no failure"
    assert page.locator('[data-node="reserve_hotel"].st-bad').count() == 1
    assert page.locator('[data-node="send_confirmation"].st-idle').count() == 1
    assert page.locator("#map-live button, #map-live form").count() == 0  # nothing to act on
    shot(page, "agent-map-wide")

    # A run fails at send_confirmation: the map counts it without a reload.
    late = run("travel", R.NEEDS_ATTENTION, ok, ("send_confirmation", S.VIOLATED),
               ("tools", S.FAILED))
    events.publish_change(late.code, "run.status", status=late.status)
    page.wait_for_function(
        "() => document.querySelector('[data-node=send_confirmation]').textContent"
        ".includes('9.1 % failed here')")
    assert node_text(page, "send_confirmation") == "send_confirmation ✕ 1 9.1 % failed here"
    assert page.locator('[data-node="send_confirmation"].st-warn').count() == 1
    assert page.locator("[data-map-runs]").get_attribute("data-map-runs") == "11"
    assert not_reloaded(page)

    # A click on a node: the runs that stopped there, created in the same window.
    page.locator('svg [data-node="reserve_hotel"] a').click()
    page.wait_for_url("**/?agent=travel&node=reserve_hotel&range=1h")
    assert " ".join(page.locator("[data-stopped]").inner_text().split()).startswith(
        "Runs that stand or stopped at reserve_hotel")
    listed = page.locator("tr[data-run]").evaluate_all("rows => rows.map(r => r.dataset.status)")
    assert sorted(listed) == ["compensated", "failed"]
    page.locator('a.chip[data-chip="failed"]').click()
    page.wait_for_selector(f"#run-{failed.code}")
    assert page.locator("tr[data-run]").count() == 1
    shot(page, "agent-map-runs")

    # On a phone: the picture fits, and the table says each count in words and numbers.
    phone, small = phone_page(browser, context, f"{daphne.url}/agents/travel/map?window=1h",
                              "table.map-table")
    row = small.locator('tr[data-map-node="reserve_hotel"]')
    assert [c.strip() for c in row.locator("td").all_inner_texts()] == [
        "0", "0", "1", "1", "18.2 %"]  # its heading says "failures"
    shot(small, "agent-map-phone")
    row.locator('td[data-what="compensated"] a').click()
    small.wait_for_url("**/?agent=travel&node=reserve_hotel&range=1h&what=compensated")
    assert small.locator("tr[data-run]").count() == 1
    shot(small, "agent-map-phone-runs")
    phone.close()
    context.close()
    assert "Traceback" not in daphne.logs()
