"""Terminate from the run page, in headless Chromium against a real Daphne, a real worker and the
local AWS: a provision run waits in its slow launch_instance; the operator opens "Terminate…",
reads what stops and what the unwind undoes (newest first), confirms; the worker stops the run
at the next step and removes each part it made, once. At 1280 and 390 px. Screenshots:
``var/test-artifacts/dashboard/50-*.png``."""

from __future__ import annotations

from typing import Any

import pytest

from stateguard_web.sagas.models import Run
from tests.agents.provision_support import NOTHING
from tests.aws_world import AwsWorld
from tests.web.api.test_end_to_end import Server, stack  # noqa: F401  (stack: a fixture)
from tests.web.conftest import Workers, ledger
from tests.web.dashboard import test_browser as ui
from tests.web.dashboard.test_browser import people  # noqa: F401  (a fixture)
from tests.web.dashboard.test_retry_from_browser import on_a_phone

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def test_an_operator_terminates_a_run_waiting_in_a_slow_step(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None, aws: AwsWorld) -> None:  # noqa: F811
    context, page, logs = ui.operator_page(browser, stack, workers)
    run = ui.submit("provision", people["shop"], name="web-stop", sleep_at="launch_instance",
                 sleep_seconds=8)
    page.goto(f"{stack.url}/runs/{run.code}/")
    ui.live(page)
    # create_group done, launch_instance sleeping (its row is written with its result).
    page.wait_for_selector('[data-step][data-node="create_group"][data-status="succeeded"]',
                           timeout=30_000)
    ui.run_status(page, "running", logs)

    page.click("button[data-dialog='confirm-terminate']")
    dialog = page.locator("#confirm-terminate")
    dialog.wait_for(state="visible")
    undo = dialog.locator(".plan li").evaluate_all("items => items.map(i => i.dataset.undo)")
    assert undo == ["create_group"]
    assert "A step that finishes before the run stops is undone too" in dialog.inner_text()
    assert "a step running now finishes first" in dialog.inner_text()
    assert dialog.locator("input[name=then][value=unwind]").is_checked()
    dialog.locator("#terminate-reason").fill("ordered the wrong size")
    ui.shot(page, "50-terminate-confirm")
    on_a_phone(page, "50-phone-terminate-confirm")
    dialog.locator("button[type=submit]").click()

    page.wait_for_url(f"{stack.url}/runs/{run.code}/")
    assert "the worker stops the run at its next step, then unwinds it" in page.inner_text(
        "body")
    ui.live(page)
    ui.run_status(page, "compensated", logs, timeout=60)
    page.wait_for_selector('[data-compensation="create_group"][data-status="succeeded"]')
    assert "terminated by olivia: ordered the wrong size" in page.inner_text(".panel-bad")
    nodes = page.locator("[data-step]").evaluate_all("els => els.map(e => e.dataset.node)")
    assert nodes == ["create_group", "launch_instance"]  # attach_address never started
    ui.shot(page, "51-terminated")
    on_a_phone(page, "51-phone-terminated")

    assert Run.objects.get(pk=run.pk).status == Run.Status.COMPENSATED
    assert ledger(run) == ["security_group", "instance", "termination", "deletion"]
    assert aws.live() == NOTHING and aws.instances(alive=False) == ["web-stop"]
    context.close()
