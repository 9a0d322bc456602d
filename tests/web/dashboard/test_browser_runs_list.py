"""The runs list as an operator lives in it, in headless Chromium against a real Daphne (no
worker: the runs are made in the journal): sorted by a heading, narrowed to two statuses,
saved as a view and opened again from the menu, walked with j and k (a live re-read keeps
the selection) and opened with Enter, exported; at 1280 px and at 390 px, and by a viewer,
who has no batch bar. Screenshots: ``var/test-artifacts/dashboard/runs-list-*.png``."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from stateguard_web.accounts.models import SavedView
from stateguard_web.sagas import events
from stateguard_web.sagas.models import Run
from tests.web.api.world import make_user
from tests.web.conftest import Server
from tests.web.dashboard.test_browser import PASSWORD, PHONE, WIDE, log_in, shot

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

S = Run.Status


def query(page: Any) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def shown(page: Any) -> list[str]:
    return [str(code) for code in page.locator("tbody tr[data-run]").evaluate_all(
        "rows => rows.map(r => r.dataset.run)")]


def focused_run(page: Any) -> str | None:
    return page.evaluate(
        "(document.activeElement.closest('tr[data-run]') || {dataset: {}}).dataset.run || null")


def fits(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"])


def make_runs() -> dict[str, Run]:
    """Eight runs a minute apart (the first newest), of three agents and four statuses."""
    now = timezone.now()
    rows = [("checkout", S.FAILED), ("travel", S.SUCCEEDED), ("checkout", S.NEEDS_ATTENTION),
            ("provision", S.FAILED), ("checkout", S.SUCCEEDED), ("travel", S.PAUSED),
            ("provision", S.NEEDS_ATTENTION), ("checkout", S.FAILED)]
    runs = {}
    for i, (agent, status) in enumerate(rows):
        created = now - timedelta(minutes=i + 2)
        run = Run.objects.create(agent=agent, status=status, input={"order": f"o-{i}"},
                                 started_at=created)
        Run.objects.filter(pk=run.pk).update(
            created_at=created, updated_at=created + timedelta(seconds=10 * (8 - i)))
        runs[f"o-{i}"] = run
    return runs


def test_an_operator_sorts_narrows_saves_and_walks_the_list(daphne: Server, browser: Any,
                                                             publisher: None) -> None:
    make_user("olivia", "operator", password=PASSWORD)
    make_user("vera", "viewer", password=PASSWORD)
    runs = make_runs()
    code = {name: str(run.code) for name, run in runs.items()}

    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, daphne.url)
    assert shown(page) == [code[f"o-{i}"] for i in range(8)]  # newest first
    assert page.locator('th[data-sort="created"]').get_attribute("aria-sort") == "descending"

    # A heading sorts by its column (names from A, each agent's newest first); again, the
    # other way.
    page.click('th[data-sort="agent"] a')
    page.wait_for_url("**/?sort=agent")
    assert shown(page) == [code[f"o-{i}"] for i in (0, 2, 4, 7, 3, 6, 1, 5)]
    assert page.locator('th[data-sort="agent"]').get_attribute("aria-sort") == "ascending"
    page.click('th[data-sort="agent"] a')
    page.wait_for_url("**/?sort=-agent")
    assert shown(page) == [code[f"o-{i}"] for i in (5, 1, 6, 3, 7, 4, 2, 0)]

    # Two statuses at once: each chip adds its own; the order stays.
    page.click('a[data-chip="failed"]')
    page.wait_for_url("**/?sort=-agent&status=failed")
    page.click('a[data-chip="needs_attention"]')
    page.wait_for_url("**/?sort=-agent&status=failed&status=needs_attention")
    assert shown(page) == [code[f"o-{i}"] for i in (6, 3, 7, 2, 0)]
    assert page.locator('a.chip[aria-current="true"]').evaluate_all(
        "chips => chips.map(c => c.dataset.chip)") == ["failed", "needs_attention"]
    assert "5 runs" in page.locator("nav.pager").inner_text()
    page.select_option("#f-agent", "checkout")  # the filter form keeps both and the order
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/?*agent=checkout*")
    assert query(page)["status"] == ["failed", "needs_attention"]
    assert query(page)["sort"] == ["-agent"]
    assert shown(page) == [code[f"o-{i}"] for i in (7, 2, 0)]
    shot(page, "runs-list-01-wide-narrowed")

    # The export is of this list: same filters, same order.
    export = page.locator("a[data-export]").get_attribute("href")
    assert export is not None and export.startswith("/runs.csv?")
    answer = context.request.get(daphne.url + export)
    assert answer.status == 200 and answer.headers["x-truncated"] == "false"
    rows = list(csv.DictReader(io.StringIO(answer.text())))
    assert [r["run"] for r in rows] == [code[f"o-{i}"] for i in (7, 2, 0)]

    # Saved as a view, found again in the menu from the whole list.
    page.click("#saved-views summary")
    page.fill("#view-name", "my checkout failures today")
    shot(page, "runs-list-02-wide-save")
    page.click("form.save-view button[type=submit]")
    page.wait_for_selector(".message-success")
    assert "Saved the view “my checkout failures today”" in page.locator(
        ".message-success").inner_text()
    saved = SavedView.objects.get()
    assert parse_qs(saved.query) == {"status": ["failed", "needs_attention"],
                                     "agent": ["checkout"], "sort": ["-agent"]}
    page.goto(daphne.url + "/")
    assert len(shown(page)) == 8
    page.click("#saved-views summary")
    page.click('li[data-view="my checkout failures today"] a')
    page.wait_for_url("**/?*agent=checkout*")
    assert shown(page) == [code[f"o-{i}"] for i in (7, 2, 0)]

    # j and k move the selection, Enter opens the run.
    page.keyboard.press("j")
    assert focused_run(page) == code["o-7"]
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("j")  # the last row stays the last
    assert focused_run(page) == code["o-0"]
    page.keyboard.press("k")
    assert focused_run(page) == code["o-2"]
    shot(page, "runs-list-03-wide-selected")
    # A run fails meanwhile: the list re-reads itself, and the selection stays where it was.
    page.evaluate("window.__sgNoReload = true")
    late = Run.objects.create(agent="checkout", status=S.FAILED, input={"order": "late"})
    events.publish_change(late.code, "run.status", status=late.status)
    page.wait_for_selector(f'tr[data-run="{late.code}"]')
    assert shown(page) == [code["o-7"], code["o-2"], code["o-0"], str(late.code)]
    assert focused_run(page) == code["o-2"]
    assert page.evaluate("window.__sgNoReload === true")
    page.fill("#f-q", "jk")  # typed in a field: not a move
    assert focused_run(page) is None
    page.focus(f'#open-{code["o-2"]}')
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/runs/{code['o-2']}/")

    # At 390 px: the list fits; its menu and the save form too.
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.set_default_timeout(15_000)
    small.goto(daphne.url + "/?" + saved.query)
    small.wait_for_selector("tbody tr[data-run]")
    assert fits(small)
    shot(small, "runs-list-04-phone")
    small.click("#saved-views summary")
    assert small.locator('li[data-view="my checkout failures today"]').is_visible()
    box = small.locator("#saved-views .menu-body").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    shot(small, "runs-list-05-phone-menu")
    phone.close()

    # A viewer: the list, its views and its export; no batch bar, and olivia's view not
    # among hers.
    viewing = browser.new_context(viewport=PHONE)
    seer = viewing.new_page()
    seer.set_default_timeout(15_000)
    log_in(seer, daphne.url, "vera")
    assert seer.locator("#batch-form").count() == 0
    seer.click('th[data-sort="status"] a')
    seer.wait_for_url("**/?sort=status")
    assert seer.locator("tbody tr[data-run] .badge").first.inner_text().endswith("failed")
    seer.click("#saved-views summary")
    assert seer.locator("li[data-view]").count() == 0
    assert "No saved view yet." in seer.locator("#saved-views").inner_text()
    shot(seer, "runs-list-06-phone-viewer")
    assert fits(seer)
    viewing.close()
    context.close()
