"""A run's timeline in headless Chromium against a real Daphne: an AI run of the travel agent
whose model asked for two tool calls at once (they ran side by side), one of which failed, and
whose charge was refunded on a second attempt. The timeline shows the model's turns on their
own lane, the two calls on two lanes, the approval's wait, and the refund's attempts with the
wait between them; it follows the run live (the journal is written here, the page hears of
it over its websocket, as from a worker), at 1280 px and, for a viewer, at 390 px, where it
scrolls in its frame and not the page.

The journal is written by the test, not by a worker: no agent here runs tools in parallel, and
the times (seconds, not a test machine's milliseconds) make a picture a person can check.
Screenshots: ``var/test-artifacts/dashboard/timeline-*.png``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from stateguard.tool_calls import TOOL_TAG
from stateguard_web.sagas import events
from stateguard_web.sagas.models import Approval, Compensation, Run, Step
from tests.web.conftest import Server
from tests.web.dashboard.conftest import ARTIFACTS
from tests.web.dashboard.test_browser import (  # noqa: F401  (people: a fixture)
    PASSWORD,
    PHONE,
    WIDE,
    live,
    not_reloaded,
    people,
    shot,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def asked(*names: str) -> dict[str, Any]:
    return {"messages": [{"type": "ai", "content": "", "tool_calls": [
        {"name": n, "args": {"destination": "Atlantis"} if n == "reserve_hotel" else {},
         "id": f"call_{n}", "type": "tool_call"} for n in names]}]}


def answered(name: str, status: str, content: str) -> dict[str, Any]:
    return {"tool_call_id": f"call_{name}", "tool": name, "args": {}, "status": status,
            "content": content, "artifact": None}


def journal(shop: Any) -> tuple[Run, Compensation, datetime]:
    """The travel run as a worker would have left it while the refund waits to be tried
    again: compensating, its first attempt failed."""
    t0 = timezone.now() - timedelta(seconds=20)
    run = Run.objects.create(agent="travel", status=Run.Status.COMPENSATING, submitted_by=shop,
                             input={"email": "a@b.co", "destination": "Atlantis",
                                    "amount": 42_000},
                             error={"type": "NoRooms", "message": "no hotel in Atlantis"})
    Run.objects.filter(pk=run.pk).update(created_at=t0)
    run.refresh_from_db()

    def step(node: str, start: float, end: float, status: str = Step.Status.SUCCEEDED,
             tool: bool = False, **extra: Any) -> Step:
        return Step.objects.create(
            run=run, step_id=f"{start}:call_{node}" if tool else f"task-{start}", node=node,
            tags=[TOOL_TAG] if tool else [], status=status, started_at=t0 + timedelta(
                seconds=start), finished_at=t0 + timedelta(seconds=end), **extra)

    step("agent", 0.3, 1.1, update=asked("charge_card"))
    Approval.objects.create(run=run, step_id="1.2:call_charge_card", node="charge_card",
                            status=Approval.Status.APPROVED, decided_by="olivia",
                            requested_at=t0 + timedelta(seconds=1.2),
                            decided_at=t0 + timedelta(seconds=6.0))
    step("tools", 6.1, 7.3, update={"messages": []})
    charge = step("charge_card", 6.15, 7.2, tool=True,
                  update=answered("charge_card", "success", '{"id": "pi_1"}'))
    step("agent", 7.4, 8.0, update=asked("reserve_hotel", "send_confirmation"))
    step("tools", 8.1, 11.0, update={"messages": []})
    step("reserve_hotel", 8.15, 10.9, Step.Status.FAILED, tool=True,
         update=answered("reserve_hotel", "error", "NoRooms: no hotel in Atlantis"),
         error={"type": "NoRooms", "message": "no hotel in Atlantis"})
    mail = step("send_confirmation", 8.2, 9.4, tool=True,
                update=answered("send_confirmation", "success", '{"sent": true}'))
    apology = Compensation.objects.create(run=run, step=mail, node="send_confirmation",
                                          idempotency_key="k-mail",
                                          status=Compensation.Status.SUCCEEDED)
    apology.attempts.create(number=1, ok=True, result="True",
                            started_at=t0 + timedelta(seconds=11.2),
                            finished_at=t0 + timedelta(seconds=11.6))
    refund = Compensation.objects.create(run=run, step=charge, node="charge_card",
                                         idempotency_key="k-charge",
                                         status=Compensation.Status.WAITING,
                                         retry_at=t0 + timedelta(seconds=14))
    refund.attempts.create(number=1, ok=False, started_at=t0 + timedelta(seconds=11.7),
                           finished_at=t0 + timedelta(seconds=12.2),
                           error={"type": "APIConnectionError",
                                  "message": "Stripe unreachable (connection refused)"})
    for comp, created in ((apology, 11.2), (refund, 11.7)):  # auto_now_add: as it was
        Compensation.objects.filter(pk=comp.pk).update(
            created_at=t0 + timedelta(seconds=created))
    return run, refund, t0


def bars(page: Any) -> list[tuple[str, str, str, str, str]]:
    """(group, lane, kind, name, status) of each bar, as drawn."""
    return [tuple(b) for b in page.locator("svg.tl a.tl-bar").evaluate_all(
        "bars => bars.map(b => [b.dataset.group, b.dataset.lane, b.dataset.kind, "
        "b.dataset.name, b.dataset.status])")]


def run_page(browser: Any, url: str, run: Run, username: str,
             viewport: dict[str, int]) -> tuple[Any, Any]:
    """A browser context of its own, logged in as ``username``, and a page on ``run``'s page,
    its websockets open."""
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(url + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url(url + "/")
    page.goto(f"{url}/runs/{run.code}/")
    live(page)
    return context, page


def test_a_runs_timeline_shows_parallel_calls_and_a_refund_live_on_a_desk_and_a_phone(
        daphne: Server, browser: Any, people: dict[str, Any],  # noqa: F811
        publisher: None) -> None:
    run, refund, t0 = journal(people["shop"])
    context, page = run_page(browser, daphne.url, run, "olivia", WIDE)

    assert bars(page) == [
        ("model", "0", "model", "agent", "succeeded"),
        ("model", "0", "model", "agent", "succeeded"),
        ("steps", "0", "step", "tools", "succeeded"),
        ("steps", "0", "step", "tools", "succeeded"),
        ("tools", "0", "tool_call", "charge_card", "succeeded"),
        ("tools", "0", "tool_call", "reserve_hotel", "failed"),
        ("tools", "1", "tool_call", "send_confirmation", "succeeded"),  # beside the hotel
        ("approvals", "0", "approval", "charge_card", "approved"),
        ("compensations", "0", "compensation", "send_confirmation", "succeeded"),
        ("compensations", "0", "compensation", "charge_card", "waiting")]
    groups = page.locator("svg.tl text.tl-group").evaluate_all(
        "texts => texts.map(t => t.textContent)")
    assert [g.split(" · ")[0] for g in groups] == ["Model", "Steps", "Tool calls", "Approvals",
                                                   "Compensations"]
    assert "up to 2 at once" in groups[2]
    # Each bar says what it is, how it ended and how long it took, to a screen reader too.
    wait = page.locator('a.tl-bar[data-kind="approval"]')
    assert wait.get_attribute("aria-label") == (
        "Wait for the approval of charge_card: approved, took 4.8 s. approved by olivia")
    hotel = page.locator('a.tl-bar[data-name="reserve_hotel"]')
    assert hotel.get_attribute("aria-label") == (
        "Tool call reserve_hotel: failed, took 2.8 s. NoRooms: no hotel in Atlantis")
    model = page.locator('a.tl-bar[data-kind="model"]').nth(1)
    assert model.get_attribute("aria-label").endswith(
        "asks for reserve_hotel, send_confirmation")
    # The refund still waits: its bar is open (dashed) and the picture ends at now.
    waiting = page.locator('a.tl-bar[data-name="charge_card"][data-kind="compensation"]')
    assert "tl-open" in waiting.get_attribute("class")
    assert page.locator("svg.tl line.tl-now").count() == 1
    assert waiting.locator(".tl-attempt").count() == 1
    # A bar is a link to its row: the failed call's step.
    hotel.click()
    assert page.evaluate("location.hash") == f"#step-{Step.objects.get(node='reserve_hotel').pk}"
    shot(page, "timeline-1280-compensating")

    # A viewer on a phone: the page fits the screen, the timeline scrolls in its frame; the
    # viewer scrolls it to its end (the latest).
    phone, small = run_page(browser, daphne.url, run, "vera", PHONE)
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    frame = small.locator("#timeline-scroll")
    assert frame.evaluate("f => f.scrollWidth > f.clientWidth")  # it scrolls, not the page
    assert small.locator("button[data-dialog]").count() == 0  # a viewer: no actions
    frame.scroll_into_view_if_needed()
    shot(small, "timeline-390")
    small.locator("section[data-timeline]").screenshot(path=_artifact("timeline-390-panel"))
    scrolled = frame.evaluate("f => { f.scrollLeft = f.scrollWidth; return f.scrollLeft; }")
    assert scrolled > 0

    # The refund's second attempt succeeds: the worker writes it and publishes; both pages
    # re-read themselves and their timelines have the attempt, without a reload, and the
    # phone's is still scrolled where its reader left it.
    at = t0 + timedelta(seconds=14)
    refund.attempts.create(number=2, ok=True, result="True", started_at=at,
                           finished_at=at + timedelta(seconds=0.4))
    Compensation.objects.filter(pk=refund.pk).update(status=Compensation.Status.SUCCEEDED,
                                                     retry_at=None)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPENSATED)
    events.publish_change(run.code, "run.status", status="compensated")
    refunded_bar = ('a.tl-bar[data-kind="compensation"][data-name="charge_card"]'
                    '[data-status="succeeded"]')
    for shown in (page, small):
        shown.wait_for_selector(refunded_bar)
        assert not_reloaded(shown)
    refunded = page.locator(refunded_bar)
    attempts = refunded.locator(".tl-attempt").evaluate_all(
        "els => els.map(e => e.dataset.attempt + ':' + e.dataset.ok)")
    assert attempts == ["1:false", "2:true"]
    assert refunded.get_attribute("aria-label") == (
        "Undo of charge_card: compensated, took 2.7 s. 2 attempts")  # 11.7 s to 14.4 s
    assert page.locator("svg.tl line.tl-now").count() == 0  # over: it ends at its last time
    assert page.locator("[data-timeline-summary]").inner_text() == (
        "14.4 s in all: queued 300 ms, the model 1.4 s, steps 4.1 s, tool calls 3.8 s, "
        "waiting for approval 4.8 s, compensating 3.1 s")
    page.locator("#timeline-h").scroll_into_view_if_needed()
    shot(page, "timeline-1280-compensated")
    page.locator("section[data-timeline]").screenshot(path=_artifact("timeline-1280-panel"))
    frame = small.locator("#timeline-scroll")  # a new element: the region was swapped
    assert frame.evaluate("f => f.scrollLeft") == scrolled
    small.locator("section[data-timeline]").screenshot(
        path=_artifact("timeline-390-panel-end"))
    phone.close()
    context.close()


def _artifact(name: str) -> str:
    return str(ARTIFACTS / f"{name}.png")
