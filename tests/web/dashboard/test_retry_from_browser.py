"""Retry from an earlier step on the run page, in headless Chromium against a real Daphne and a
real worker: a provision run held failed at its last step (create_record); the operator opens
launch_instance, "Retry from here…", reads what will be undone first (newest first) and what
runs again, sets the state's update and confirms; the worker releases the address and
terminates the instance once each and runs the rest again to success."""

from __future__ import annotations

from typing import Any

import pytest

from stateguard_web.sagas.models import Run
from tests.agents.provision_support import server
from tests.aws_world import AwsWorld
from tests.web.api.test_end_to_end import Server, stack  # noqa: F401  (stack: a fixture)
from tests.web.conftest import Workers, ledger, wait_for
from tests.web.dashboard.test_browser import (
    live,
    operator_page,
    people,  # noqa: F401  (a fixture)
    run_status,
    shot,
    submit,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def test_an_operator_retries_a_run_from_an_earlier_step_on_its_page(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None, aws: AwsWorld) -> None:  # noqa: F811
    url = stack.url
    context, page, logs = operator_page(browser, stack, workers)
    run = submit("provision", people["shop"], name="web-rf", fail_at="create_record",
                 hold_failure=True)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.FAILED, 30,
             "the run to be held failed at create_record", logs)
    page.goto(f"{url}/runs/{run.code}/")
    step = page.locator('[data-step][data-node="launch_instance"]')
    step.locator("summary").click()
    step.locator("a.retry-from").click()
    page.wait_for_selector("#retry-from-form")
    undo = page.locator("#retry-from-undo li").evaluate_all(
        "items => items.map(i => i.dataset.node)")
    assert undo == ["attach_address", "launch_instance"]  # newest first
    assert "launch_instance and every step after it run again" in page.locator(
        "#retry-from-rerun").inner_text()
    page.fill("#id_update", '{"fail_at": null}')
    shot(page, "40-retry-from-confirm")
    on_a_phone(page, "40-phone-retry-from-confirm")
    page.locator("#retry-from-form button[type=submit]").click()
    page.wait_for_url(f"{url}/runs/{run.code}/")
    live(page)
    run_status(page, "succeeded", logs, timeout=60)
    assert page.locator('[data-step][data-status="rewound"]').count() == 3
    shot(page, "41-retry-from-done")
    on_a_phone(page, "41-phone-retry-from-done")
    assert ledger(run) == ["security_group", "instance", "elastic_ip", "release", "termination",
                           "instance", "elastic_ip", "dns_record"]
    assert aws.live() == server("web-rf") and aws.instances(alive=False) == ["web-rf"] * 2
    context.close()


def on_a_phone(page: Any, name: str) -> None:
    """The page at 390 px, as an operator on call sees it: nothing wider than the screen."""
    size = page.viewport_size
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        shot(page, name)
    finally:
        page.set_viewport_size(size)
