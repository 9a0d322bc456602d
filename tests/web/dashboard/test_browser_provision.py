"""A provisioned server's run page, in headless Chromium against a real Daphne, a real worker and
moto's server (the local AWS): the ledger lists the security group, the instance, the Elastic
IP and the DNS record by the ids AWS gave them; a run that fails at its last step shows each
part compensated and its removal, and AWS has nothing of it left. At 1280 and 390 px.
Screenshots: ``var/test-artifacts/dashboard/provision-*.png``."""

from __future__ import annotations

from typing import Any

import pytest

from stateguard_web.sagas.models import Run
from tests.agents.provision_support import server
from tests.aws_world import AwsWorld
from tests.web.api.test_end_to_end import Server, stack  # noqa: F401  (stack: a fixture)
from tests.web.conftest import Workers
from tests.web.dashboard.test_browser import (  # noqa: F401  (people: a fixture)
    PHONE,
    operator_page,
    people,
    run_status,
    shot,
    submit,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def ledger_rows(page: Any) -> list[tuple[str, str, str, str]]:
    """The ledger as shown: (status, what, id, step) per row."""
    rows = page.locator("table.effects tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells).map(c => c.innerText.trim()))")
    return [(cells[0].split()[-1], " ".join(cells[1].split()), cells[3], cells[4])
            for cells in rows]  # the status badge: an icon, then the word


def on_a_phone(browser: Any, context: Any, url: str, name: str) -> None:
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    page = phone.new_page()
    page.goto(url)
    page.wait_for_selector("table.effects")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, name)
    phone.close()


def test_a_provisioned_servers_page_shows_its_parts_in_the_ledger(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None, aws: AwsWorld) -> None:  # noqa: F811
    context, page, logs = operator_page(browser, stack, workers)
    made = submit("provision", people["shop"], name="web-shop")
    page.goto(f"{stack.url}/runs/{made.code}/")
    run_status(page, "succeeded", logs, timeout=60)
    page.wait_for_selector('[data-effect="dns_record"]')

    assert aws.live() == server("web-shop")
    [instance] = aws.ec2.describe_instances()["Reservations"][0]["Instances"]
    [address] = aws.ec2.describe_addresses()["Addresses"]
    [group] = [g for g in aws.ec2.describe_security_groups()["SecurityGroups"]
               if g["GroupName"] == "stateguard-web-shop"]
    assert ledger_rows(page) == [
        ("applied", "ec2 security_group", group["GroupId"], "create_group"),
        ("applied", "ec2 instance", instance["InstanceId"], "launch_instance"),
        ("applied", "ec2 elastic_ip", address["AllocationId"], "attach_address"),
        ("applied", "route53 dns_record", f"web-shop.stateguard.test. A {made.code}",
         "create_record")]
    step = page.locator('[data-step][data-node="attach_address"]')
    step.locator("summary").click()
    assert address["PublicIp"] in step.inner_text()  # the step's result: the address
    shot(page, "provision-succeeded")
    on_a_phone(browser, context, page.url, "provision-phone-succeeded")

    # The same request failing at its last step: each part it made is removed, newest first,
    # and the ledger shows them compensated, with each removal beside them.
    failed = submit("provision", people["shop"], name="web-fail", fail_at="create_record")
    page.goto(f"{stack.url}/runs/{failed.code}/")
    run_status(page, "compensated", logs, timeout=60)
    page.wait_for_selector('[data-effect="deletion"]')
    rows = ledger_rows(page)
    assert [(status, what.split(" of ")[0]) for status, what, _, _ in rows] == [
        ("compensated", "ec2 security_group"), ("compensated", "ec2 instance"),
        ("compensated", "ec2 elastic_ip"), ("undoes", "ec2 release"),
        ("undoes", "ec2 termination"), ("undoes", "ec2 deletion")]
    made_ids = [row[2] for row in rows[:3]]
    assert [row[1].split(" of ")[1] for row in rows[3:]] == list(reversed(made_ids))
    assert aws.live() == server("web-shop")  # nothing of web-fail left, web-shop whole
    assert Run.objects.get(pk=failed.pk).status == Run.Status.COMPENSATED
    page.locator("[data-compensation] summary").first.click()
    shot(page, "provision-compensated")
    on_a_phone(browser, context, page.url, "provision-phone-compensated")
    context.close()
