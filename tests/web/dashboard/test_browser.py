"""The dashboard end to end in headless Chromium (Playwright driving Debian's ``chromium``;
``playwright install`` cannot download here): a real Daphne serving the ASGI app, a real Celery
worker, localstripe, and the test driving only the browser (and submitting runs as a shop
would).

Screenshots of every page go to ``var/test-artifacts/dashboard/`` (``STATEGUARD_ARTIFACTS``
names another folder); they are not committed, except the run page's in docs/img/.

Every test fails, too, on what a person would not see but must not happen on any page: a
violation of the Content-Security-Policy that Chromium reports, an error thrown by the page's
script, or a request of the page answered 404 (``browser``, a watched Chromium).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from stateguard_web.runs import services
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step
from tests.conftest import STRIPE_TEST_KEY
from tests.web.api.test_end_to_end import Server, stack  # noqa: F401  (stack: a fixture)
from tests.web.api.world import make_user
from tests.web.conftest import Workers, wait_for
from tests.web.dashboard.conftest import ARTIFACTS
from tests.web.stripe_relay import StripeRelay
from tests.web.test_workers import next_nodes

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]

PASSWORD = "correct horse battery staple"
WIDE, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}


@pytest.fixture
def people(transactional_db: None) -> dict[str, Any]:
    return {"olivia": make_user("olivia", "operator", password=PASSWORD),
            "vera": make_user("vera", "viewer", password=PASSWORD),
            "shop": make_user("shop", "submitter")}


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def log_in(page: Any, url: str, username: str = "olivia") -> None:
    page.goto(url + "/")
    page.wait_for_url("**/login/?next=/")
    shot(page, "01-login")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url(url + "/")


def operator_page(browser: Any, server: Server, workers: Workers
                  ) -> tuple[Any, Any, Callable[[], str]]:
    """A browser context and page, logged in as olivia (an operator); and the servers' logs."""
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, server.url)
    return context, page, lambda: server.logs() + workers.logs()


def live(page: Any) -> None:
    """Wait until the page's websockets are open, and mark the page: a reload loses the mark."""
    page.wait_for_selector('#live-indicator[data-state="on"]', timeout=10_000)
    page.evaluate("window.__sgNoReload = true")


def not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("window.__sgNoReload === true"))


def run_status(page: Any, status: str, logs: Callable[[], str], timeout: float = 30) -> None:
    """Wait until the page shows the run in ``status``; else fail with the servers' logs."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(f'[data-run-status="{status}"]', timeout=timeout * 1000)
    except PlaywrightTimeout:
        shown = page.locator("[data-run-status]").get_attribute("data-run-status")
        pytest.fail(f"the page shows the run {shown}, not {status}\n{logs()[-8000:]}")


def phone_page(browser: Any, context: Any, url: str, ready: str) -> tuple[Any, Any]:
    """A phone's context, as ``context``'s user, and its page at ``url`` once ``ready`` shows:
    a page that fits the phone's width."""
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(url)
    small.wait_for_selector(ready)
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    return phone, small


def submit(agent: str, shop: Any, **data: Any) -> Run:
    return services.run_submit(agent=agent, input=data, by=services.Actor(shop))


def test_it_serves_an_operators_day_live(stack: Server, workers: Workers, browser: Any,  # noqa: F811
                                         people: dict[str, Any], publisher: None,
                                         stripe_client: stripe.StripeClient) -> None:
    url, shop = stack.url, people["shop"]
    context, page, logs = operator_page(browser, stack, workers)
    live(page)

    # A run submitted meanwhile appears in the open list, without a reload.
    slow = submit("provision", shop, name="web-e2e", sleep_at="create_group",
                  sleep_seconds=3)
    page.wait_for_selector(f'#run-{slow.code}')
    assert not_reloaded(page)
    shot(page, "02-runs-list")

    # Its detail page, opened while its first step runs: the others appear without a reload.
    page.click(f'#run-{slow.code} a.run-link')
    page.wait_for_url(f"**/runs/{slow.code}/")
    live(page)
    assert page.locator('[data-step][data-status="succeeded"]').count() < 4
    page.wait_for_selector('[data-step][data-node="create_record"][data-status="succeeded"]',
                           timeout=30_000)
    run_status(page, "succeeded", logs)
    nodes = page.locator("[data-step]").evaluate_all("els => els.map(e => e.dataset.node)")
    assert nodes == ["create_group", "launch_instance", "attach_address", "create_record"]
    assert page.locator('.graph-node.st-ok').count() == 4
    assert not_reloaded(page)
    shot(page, "03-run-succeeded")

    # A checkout over 100.00 waits for an approval, given from the page, and charges once.
    # The worker is stopped first, so that the page shows the request waiting for one, then
    # (live) that a worker took it up.
    big = submit("checkout", shop, email="big@shop.test", amount=250_00)
    page.goto(f"{url}/runs/{big.code}/")
    live(page)
    run_status(page, "paused", logs)
    assert page.locator(".panel-wait .amount").inner_text() == "250.00 USD"
    shot(page, "04-run-paused")
    page.click("nav a[href='/inbox/approvals/']")
    page.wait_for_selector(f"#run-{big.code}")
    assert " ".join(page.locator("#nav-count-approvals").inner_text().split()) == ": 1 waiting"
    shot(page, "05-inbox-approvals")
    page.click(f"#run-{big.code} a.run-link")
    for proc in list(workers.procs):
        workers.kill(proc)
    page.click("button[data-dialog^='confirm-approve-']")
    dialog = page.locator("dialog[open]")
    assert "250.00 USD" in dialog.inner_text() and "big@shop.test" in dialog.inner_text()
    assert page.evaluate("document.activeElement.closest('dialog') !== null")  # focus inside
    shot(page, "06-confirm-approve")
    page.keyboard.press("Escape")  # a keyboard user can back out...
    assert page.locator("dialog[open]").count() == 0
    assert Approval.objects.get(run=big).status == Approval.Status.PENDING
    page.click("button[data-dialog^='confirm-approve-']")  # ...and confirm
    page.locator("dialog[open] button[type=submit]").click()
    page.wait_for_selector('[data-request="approve by olivia"]')
    live(page)
    shot(page, "07-request-waiting")
    workers.start("w2")
    page.wait_for_selector(".message-success:has-text('A worker has taken up the request: "
                           "approve by olivia.')", timeout=30_000)
    run_status(page, "succeeded", logs)
    assert page.locator('[data-step][data-status="succeeded"]').count() == 3
    assert page.locator('[data-effect="charge"] .badge').inner_text().strip().endswith("applied")
    charges = stripe_client.v1.charges.list().data
    assert [c.amount for c in charges] == [250_00]
    assert not_reloaded(page)

    # A failing run shows its compensations, in the order they ran (newest step first).
    failing = submit("provision", shop, name="web-fail", fail_at="attach_address")
    page.goto(f"{url}/runs/{failing.code}/")
    run_status(page, "compensated", logs)
    shown = page.locator("[data-compensation]").evaluate_all(
        "els => els.map(e => e.dataset.compensation)")
    ran = list(Compensation.objects.filter(run=failing).order_by("created_at", "pk")
               .values_list("node", flat=True))
    assert shown == ran == ["attach_address", "launch_instance", "create_group"]
    page.locator("[data-compensation] summary").first.click()
    shot(page, "08-run-compensated")

    # A checkout whose booking fails is refunded: the ledger shows the charge undone. (This
    # page is the README's picture: docs/img/run-detail.png.)
    refunded = submit("checkout", shop, email="refund@shop.test", amount=42_00,
                      fail_booking=True)
    page.goto(f"{url}/runs/{refunded.code}/")
    run_status(page, "compensated", logs)
    page.wait_for_selector('[data-effect="refund"]')
    badge = page.locator('[data-effect="charge"] .badge').inner_text().strip()
    assert badge.endswith("compensated")
    assert page.locator("[data-compensation]").evaluate_all(
        "els => els.map(e => e.dataset.compensation + ' ' + e.dataset.status)") == [
        "charge_user succeeded"]
    page.locator("[data-compensation] summary").first.click()
    shot(page, "09-run-refunded")

    # "Compensate now" unwinds a paused run; the dialog says what will run first.
    paused = submit("checkout", shop, email="hold@shop.test", amount=300_00)
    page.goto(f"{url}/runs/{paused.code}/")
    live(page)
    run_status(page, "paused", logs)
    page.click("button[data-dialog='confirm-compensate']")
    text = page.locator("dialog[open]").inner_text()
    assert "nothing is undone" in text and "its pending approval is not run" in text
    shot(page, "10-confirm-compensate")
    page.locator("dialog[open] button[type=submit]").click()
    run_status(page, "compensated", logs)
    assert sorted(c.amount for c in stripe_client.v1.charges.list().data) == [42_00, 250_00]
    # (none of 300.00: the paused run was never charged)

    # The inbox of runs that need attention, and the pages at a phone's width.
    stuck = Run.objects.create(agent="provision", status=Run.Status.NEEDS_ATTENTION,
                               submitted_by=shop, input={"name": "web-stuck"})
    step = Step.objects.create(run=stuck, step_id="s1", node="attach_address",
                               status=Step.Status.SUCCEEDED, started_at=stuck.created_at,
                               finished_at=stuck.created_at, done_seq=1)
    Compensation.objects.create(run=stuck, step=step, node="attach_address",
                                idempotency_key="k-stuck", status=Compensation.Status.FAILED)
    page.goto(f"{url}/inbox/attention/")
    page.wait_for_selector(f"#run-{stuck.code}")
    shot(page, "11-inbox-attention")
    page.goto(f"{url}/runs/{stuck.code}/")
    page.click("button[data-dialog='confirm-resolve']")
    shot(page, "12-confirm-resolve")

    # A viewer sees the same run with no action, and a POST forged with the viewer's own
    # session and CSRF token (what a button would send) is refused and changes nothing.
    viewing = browser.new_context(viewport=WIDE)
    seer = viewing.new_page()
    log_in(seer, url, "vera")
    seer.goto(f"{url}/runs/{stuck.code}/")
    seer.wait_for_selector("[data-compensation]")
    assert seer.locator("button[data-dialog], form[action*='/resolve']").count() == 0
    live(seer)
    shot(seer, "17-viewer-run")
    audit_before = AuditEvent.objects.filter(run=stuck).count()
    status = seer.evaluate("""async (path) => {
        const token = document.querySelector("input[name=csrfmiddlewaretoken]").value;
        const body = new URLSearchParams({csrfmiddlewaretoken: token, note: "forged"});
        const answer = await fetch(path, {method: "POST", body, redirect: "manual"});
        return answer.status;
    }""", f"/runs/{stuck.code}/resolve")
    assert status == 403
    stuck.refresh_from_db()
    assert stuck.status == Run.Status.NEEDS_ATTENTION
    assert AuditEvent.objects.filter(run=stuck).count() == audit_before
    # The server logs the refusal in one line, not with the refusal's traceback.
    refused = f"Forbidden (Permission denied): /runs/{stuck.code}/resolve"
    wait_for(lambda: refused in stack.logs(), 10, "the refusal in the log", stack.logs)
    lines = stack.logs().splitlines()
    after = lines[next(i for i, line in enumerate(lines) if refused in line) + 1:]
    assert not after or not after[0].startswith("Traceback"), after[:3]
    viewing.close()

    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(url + "/")
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(small, "13-phone-runs-list")
    small.goto(f"{url}/runs/{big.code}/")
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(small, "14-phone-run")
    phone.close()
    context.close()


def test_it_shows_what_happened_while_the_websocket_was_cut(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None, tmp_path: Path) -> None:
    url = stack.url
    context, page, logs = operator_page(browser, stack, workers)
    run = submit("checkout", people["shop"], email="cut@shop.test", amount=120_00)
    page.goto(f"{url}/runs/{run.code}/")
    live(page)
    run_status(page, "paused", logs)
    assert page.locator('[data-step][data-node="book_order"]').count() == 0

    stack.stop()  # the connection drops: the page says so and keeps trying
    page.wait_for_selector('#live-indicator[data-state="off"]')
    shot(page, "15-reconnecting")
    approval = Approval.objects.get(run=run)
    services.run_approve(run=run, by=services.Actor(people["olivia"]),
                         step_id=approval.step_id)
    wait_for(lambda: Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED, 30,
             "the worker to finish the run", workers.logs)
    time.sleep(1)  # the steps' events were published to no one
    back = Server(workers.env, tmp_path / "daphne-again.log", port=stack.port)
    try:
        back.wait_until_up()
        run_status(page, "succeeded", logs, timeout=45)
        page.wait_for_selector('[data-step][data-node="book_order"][data-status="succeeded"]')
        page.wait_for_selector('#live-indicator[data-state="on"]')
        assert not_reloaded(page)
        shot(page, "16-reconnected")
    finally:
        back.stop()
        context.close()


def test_an_operator_approves_an_ai_agents_tool_call_from_its_page(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None,
        stripe_client: stripe.StripeClient) -> None:
    """The travel agent (create_react_agent, scripted model) asks to charge 250.00: its `tools`
    step waits as paused (not failed), the panel names the tool and what its arguments charge,
    and approving it from the page books the trip with one charge."""
    url = stack.url
    context, page, logs = operator_page(browser, stack, workers)
    trip = submit("travel", people["shop"], email="trip@shop.test", destination="Lisbon",
                  nights=2, amount=250_00)
    page.goto(f"{url}/runs/{trip.code}/")
    live(page)
    run_status(page, "paused", logs)
    panel = page.locator(".panel-wait")
    assert "The agent's call of charge_card waits for an approval" in panel.inner_text()
    assert panel.locator(".amount").inner_text() == "250.00 USD"
    assert page.locator('[data-step][data-node="tools"]').first.get_attribute(
        "data-status") == "paused"
    shot(page, "18-tool-approval")
    page.click("button[data-dialog^='confirm-approve-']")
    dialog = page.locator("dialog[open]")
    assert "calls the tool charge_card" in dialog.inner_text()
    shot(page, "19-confirm-tool-approval")
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(f"{url}/runs/{trip.code}/")
    live(small)
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(small, "20-phone-tool-approval")
    phone.close()
    dialog.locator("button[type=submit]").click()
    run_status(page, "succeeded", logs)
    assert [c.amount for c in stripe_client.v1.charges.list().data] == [250_00]
    # Beside the steps, the conversation: each call the model asked for, then its answer.
    talk = page.locator(".conversation")
    assert talk.locator("[data-asks]").evaluate_all("a => a.map(x => x.dataset.asks)") == [
        "charge_card", "reserve_hotel", "send_confirmation"]
    assert talk.locator('[data-turn="tool"]').evaluate_all(
        "t => t.map(x => x.dataset.tool + ':' + x.dataset.status)") == [
        "charge_card:success", "reserve_hotel:success", "send_confirmation:success"]
    charged = talk.locator('[data-tool="charge_card"]').inner_text()
    assert '"amount": 25000' in charged and "payment_intent_id" in charged
    assert "Your trip to Lisbon is booked." in talk.inner_text()
    shot(page, "21-tool-run-succeeded")
    page.set_viewport_size(PHONE)
    talk.scroll_into_view_if_needed()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "21a-phone-conversation")
    page.set_viewport_size(WIDE)

    # The customer cancels: the operator compensates the trip that succeeded. Each undo runs
    # outside the agent's graph (the apology e-mail's used to ask LangGraph for its config and
    # failed on every attempt: issue 18, item 12).
    page.click("button[data-dialog='confirm-compensate']")
    dialog = page.locator("dialog[open]")
    assert "send_confirmation" in dialog.inner_text() or "charge_card" in dialog.inner_text()
    dialog.locator("button[type=submit]").click()
    run_status(page, "compensated", logs)
    statuses = page.locator("[data-compensation]").evaluate_all(
        "items => items.map(c => c.getAttribute('data-status'))")
    assert statuses and "failed" not in statuses and "waiting" not in statuses, statuses
    [charge] = stripe_client.v1.charges.list().data
    assert charge.amount_refunded == 250_00
    # The ledger fits the page at 1280 px: its long ids (Message-IDs) wrap, not the table.
    assert page.evaluate("(() => { const w = document.querySelector('.effects')"
                         ".closest('.table-wrap'); return w.scrollWidth <= w.clientWidth; })()")
    shot(page, "21b-tool-run-compensated")

    # The e-mails went over SMTP to the test's server: the ledger links each to the Outbox.
    links = page.locator("[data-mail-link]")
    assert links.count() == 2  # the confirmation, and the apology that undoes it
    links.nth(1).click()
    page.wait_for_selector("[data-in-reply-to]")
    apology_url = page.url
    assert page.locator(".mail-subject").inner_text() == "Cancelled: your trip to Lisbon"
    assert page.locator("[data-run]").get_attribute("data-run") == str(trip.code)
    assert "it is cancelled" in page.locator(".mail-body").inner_text()
    shot(page, "35-outbox-apology")
    page.click("[data-in-reply-to]")  # the confirmation it answers
    page.wait_for_selector('.mail-subject:has-text("Your trip to Lisbon")')
    page.click("nav.nav >> text=Outbox")
    page.wait_for_selector("table.outbox")
    rows = page.locator(f'tr[data-run="{trip.code}"] td.subject > a')
    assert rows.all_inner_texts() == ["Cancelled: your trip to Lisbon", "Your trip to Lisbon"]
    shot(page, "36-outbox")
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    for address, name in [(url + "/outbox/", "37-phone-outbox"),
                          (apology_url, "38-phone-outbox-apology")]:
        small.goto(address)
        assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], name
        shot(small, name)
    phone.close()
    context.close()


def test_a_person_locked_out_after_wrong_passwords_is_told_why_and_for_how_long(
        browser: Any, people: dict[str, Any], tmp_path: Path) -> None:
    """Three wrong passwords for olivia (the limit here), then the right one: still refused,
    with the message; at 390 px too. Sign-ins are throttled (accounts/throttle.py)."""
    env = {**Workers(tmp_path / "sandbox", tmp_path).env, "STATEGUARD_ENV_FILE": "",
           "STATEGUARD_LOGIN_FAILURES_PER_ACCOUNT": "3"}
    server = Server(env, tmp_path / "daphne.log")
    try:
        server.wait_until_up()
        for viewport, name in [(WIDE, "22-login-locked-out"), (PHONE, "23-phone-login-locked-out")]:
            context = browser.new_context(viewport=viewport)
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(server.url + "/login/")
            for password in ["guess-1", "guess-2", "guess-3", PASSWORD]:
                page.fill("#id_username", "olivia")
                page.fill("#id_password", password)
                page.click("form button[type=submit]")
                page.wait_for_load_state()
            alert = page.locator("[role=alert]")
            assert "Too many failed sign-ins for this username" in alert.inner_text()
            assert "try again in 15 minutes" in alert.inner_text()
            assert page.url == server.url + "/login/"  # not let in with the right password
            assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
            shot(page, name)
            context.close()
    finally:
        server.stop()
    assert AuditEvent.objects.filter(action="login.locked_out").count() == 1


# -- issue 18: what the operator could not tell from the pages -----------------------------------

@pytest.fixture
def site(workers: Workers, localstripe_url: str, tmp_path: Path) -> Iterator[Server]:
    """The web server on the test database, with no worker (``workers.start`` adds them)."""
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY=STRIPE_TEST_KEY,
                       STATEGUARD_ENV_FILE="")
    server = Server(workers.env, tmp_path / "daphne.log")
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


def banner(page: Any) -> str:
    return " ".join(page.locator("[data-workers-down]").inner_text().split())


def test_it_warns_on_every_page_while_no_worker_is_alive(
        site: Server, workers: Workers, browser: Any, people: dict[str, Any],
        publisher: None) -> None:
    """With no worker, runs stay pending: every page says so (and it comes and goes live as
    workers start and stop), and the list says how long each pending run has waited. Then a
    batch's confirmation and page say what it will do and what it did."""
    url, shop = site.url, people["shop"]
    context, page, logs = operator_page(browser, site, workers)
    live(page)
    assert banner(page).startswith("⚠ No worker is alive: none has sent a heartbeat in the "
                                   "last 1 min.")
    run = submit("provision", shop, name="web-waits")
    row = page.locator(f"#run-{run.code}")
    row.wait_for()
    assert row.get_attribute("data-status") == "pending" and not_reloaded(page)
    waited = row.locator(".waited")
    first = waited.inner_text()
    assert first.startswith("waiting ") and first.endswith(" s")
    page.wait_for_function("([row, before]) => document.querySelector(row + ' .waited')"
                           ".textContent !== before", arg=[f"#run-{run.code}", first])
    # (it keeps counting; the row may be a new element by then: the list re-reads itself)
    page.wait_for_selector("[data-workers-down] [data-pending-count]")
    assert "1 run waits now" in banner(page)
    shot(page, "22-no-worker-runs-list")
    page.click(f"#run-{run.code} a.run-link")
    live(page)
    assert "the run waits for a worker (waiting" in page.locator("#run-live").inner_text()
    assert banner(page).startswith("⚠ No worker is alive")
    shot(page, "23-no-worker-run")
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(url + "/")
    small.wait_for_selector("[data-workers-down]")
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(small, "24-phone-no-worker")
    phone.close()

    # A worker starts: the banner goes (the page asks every 15 s), and the run runs.
    worker = workers.start("w1")  # (a worker's start-up takes seconds on a busy machine)
    page.wait_for_selector("[data-workers-down]", state="detached", timeout=60_000)
    run_status(page, "succeeded", logs, timeout=60)
    assert not_reloaded(page)

    # A batch: its confirmation names the runs it will act on, the button too.
    done = Run.objects.create(agent="provision", status=Run.Status.COMPENSATED,
                              submitted_by=shop, input={"name": "web-done"})
    page.goto(url + "/")
    for code in (run.code, done.code):
        page.check(f"#run-{code} input[data-pick]")
    page.select_option("#batch-action", "compensate")
    page.click("#batch-form button[type=submit]")
    page.wait_for_selector("[data-eligible]")
    assert page.locator("h1").inner_text() == "Compensate 1 of 2 runs?"
    button = page.locator("form[action='/batches/'] button[type=submit]")
    assert button.inner_text() == "Compensate 1 run"
    assert "compensation request" in page.locator("label[for=batch-reason]").inner_text()
    shot(page, "25-batch-confirm")
    button.click()
    page.wait_for_url("**/batches/*/")
    live(page)
    what = page.locator(f'tr[data-item="{run.code}"] [data-what]')
    try:
        page.wait_for_selector(f'tr[data-item="{run.code}"] [data-what]:has-text('
                               "'the run is compensated now')", timeout=45_000)
    except PlaywrightTimeout:
        pytest.fail(f"{page.locator('table').inner_text()}\n{logs()[-8000:]}")
    assert what.inner_text() == ("Requested, and a worker took it up: the run is compensated "
                                 "now.")
    outcome = page.locator(f'tr[data-item="{run.code}"] [data-status="done"]')
    assert outcome.inner_text().strip().endswith("requested")
    skipped = page.locator(f'tr[data-item="{done.code}"] [data-what]').inner_text()
    assert "is compensated; only a paused, failed, succeeded or needs-attention run" in skipped
    shot(page, "26-batch-done")

    # The worker stops: the banner is back on the open page.
    workers.stop(worker)
    page.wait_for_selector("[data-workers-down]", timeout=45_000)  # it said goodbye
    assert banner(page).startswith("⚠ No worker is alive")
    shot(page, "27-worker-stopped")
    context.close()


def test_it_shows_a_step_cut_off_by_a_dead_worker_in_doubt(
        stack: Server, workers: Workers, browser: Any,  # noqa: F811
        people: dict[str, Any], publisher: None) -> None:
    """A worker SIGKILLed in the middle of attach_address: recovery unwinds the run, and the
    step it cut off is "in doubt" (not "running") in the list and the graph, and says why."""
    url = stack.url
    context, page, logs = operator_page(browser, stack, workers)
    run = submit("provision", people["shop"], name="web-cut", sleep_at="attach_address",
                 sleep_seconds=60)
    # The checkpoint that names attach_address next is saved before its body starts, and the
    # body sleeps a minute before its effect: kill the worker there (as test_workers does).
    wait_for(lambda: next_nodes(run) == ("attach_address",), 30,
             "the worker to go on into attach_address", logs)
    (doomed,) = workers.procs
    workers.kill(doomed)
    workers.start("rescuer", beat=True)
    page.goto(f"{url}/runs/{run.code}/")
    live(page)
    run_status(page, "compensated", logs, timeout=60)
    cut = page.locator('[data-step][data-node="attach_address"]')
    assert cut.get_attribute("data-status") == "in_doubt"
    badge = cut.locator(".badge")
    assert badge.inner_text().strip().endswith("in doubt")
    assert "Whether it had its effect is unknown." in (badge.get_attribute("title") or "")
    assert cut.locator("[data-in-doubt]").inner_text().endswith(
        "Its compensation looked and found nothing to undo.")
    node = page.locator('.graph-node[data-node="attach_address"]')
    assert "st-warn" in (node.get_attribute("class") or "")
    assert node.locator(".graph-status").text_content() == "in doubt · nothing to undo"
    assert "Started and never finished" in (node.locator("title").text_content() or "")
    assert "running" not in " ".join(page.locator(".graph-status").all_text_contents())
    shot(page, "28-run-in-doubt")
    phone, small = phone_page(browser, context, f"{url}/runs/{run.code}/",
                              '[data-node="attach_address"][data-status="in_doubt"]')
    shot(small, "29-phone-run-in-doubt")
    phone.close()
    context.close()


def test_it_shows_a_refund_waiting_out_an_outage_and_an_operator_retries_it_now(
        site: Server, workers: Workers, browser: Any, people: dict[str, Any],
        publisher: None, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    """Stripe goes out of reach after the charge: the refund fails five times alike, with the
    SDK's long message each time, and waits to be tried again (in ten minutes, here). The page
    shows the run compensating and when its next attempt comes; the attempts once, in words,
    the message behind a click. Stripe back, the operator does not wait: "Retry now"."""
    workers.env.update(STRIPE_API_BASE=relay.url,
                       STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL="600",
                       STATEGUARD_COMPENSATION_RETRY_LATER_CAP="600")
    down = relay.drop(b"GET /v1/payment_intents/")  # the refund's first call: Stripe gone
    workers.start("w1")
    context, page, logs = operator_page(browser, site, workers)
    run = submit("checkout", people["shop"], email="outage@shop.test", amount=42_00,
                 fail_booking=True)
    page.goto(f"{site.url}/runs/{run.code}/")
    live(page)
    undo = page.locator('[data-compensation="charge_user"]')
    try:
        page.wait_for_selector('[data-compensation="charge_user"][data-status="waiting"]',
                               timeout=90_000)
    except PlaywrightTimeout:
        pytest.fail(f"the refund does not wait on the page\n{logs()[-8000:]}")
    run_status(page, "compensating", logs)
    attempts = undo.locator('tr[data-attempts="5"]')
    assert attempts.locator("td.num").inner_text() == "1\u20135"
    assert attempts.locator("strong").inner_text() == "5 attempts:"
    assert attempts.locator(".error-summary").inner_text() == (
        "Stripe unreachable (connection dropped)")
    assert undo.locator("tr[data-attempts]").count() == 1
    assert " ".join(undo.locator("summary .badge").inner_text().split()) == "◷ waiting to retry"
    # When: the time the journal keeps, in the reader's time and how long from now.
    retry_at = Compensation.objects.get(run=run).retry_at
    assert retry_at is not None
    when = page.locator("[data-next-attempt] time")
    assert when.get_attribute("datetime") == retry_at.isoformat()
    # Today's time of day; another day's (the attempt falls after midnight) with its date.
    assert re.fullmatch(r"next attempt at (\d{1,2}:\d{2}:\d{2}|[A-Z][a-z]{2} \d{1,2}, \d{4}, "
                        r"\d{1,2}:\d{2})( [AP]M)? · in (9|10) min\.?",
                        " ".join(page.locator("[data-next-attempt]").inner_text().split()))
    raw = attempts.locator("pre.error-raw")
    assert not raw.is_visible()
    # The worker's events told the page that a worker is alive: no banner says otherwise.
    page.wait_for_selector("[data-workers-down]", state="detached")
    shot(page, "30-refund-waiting")
    attempts.locator("summary", has_text="The error as raised (each of the 5 times)").click()
    assert raw.is_visible()
    assert raw.inner_text().startswith("APIConnectionError: Unexpected error communicating "
                                       "with Stripe.")
    shot(page, "31-attempts-raw-error")
    phone = browser.new_context(viewport=PHONE, storage_state=context.storage_state())
    small = phone.new_page()
    small.goto(f"{site.url}/runs/{run.code}/")
    small.wait_for_selector('tr[data-attempts="5"]')
    assert small.locator("[data-next-attempt]").is_visible()
    assert small.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(small, "32-phone-refund-waiting")
    phone.close()

    relay.lift(down)  # Stripe is back; the operator does not wait ten minutes
    undo.locator("button[data-dialog^='confirm-retry-comp-']", has_text="Retry now").click()
    dialog = page.locator("dialog[open]")
    assert "Retry the compensation of charge_user now?" in dialog.inner_text()
    shot(page, "33-confirm-retry-now")
    dialog.locator("button[type=submit]").click()
    run_status(page, "compensated", logs, timeout=60)
    assert page.locator("[data-next-attempt]").count() == 0
    assert [(c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data] == [
        (42_00, 42_00)]
    page.wait_for_selector('[data-effect="refund"]')
    shot(page, "34-refund-retried-now")
    context.close()


def test_every_page_passes_its_content_security_policy(
        site: Server, workers: Workers, browser: Any, people: dict[str, Any]) -> None:
    """The dashboard's pages, the admin's and the API docs, as a superuser opens them: the
    policy is on each, and ``browser`` fails the test on any violation Chromium reports (or a
    404, such as a missing favicon)."""
    url = site.url
    make_user("root", is_superuser=True, is_staff=True, password=PASSWORD)
    stuck = Run.objects.create(agent="provision", status=Run.Status.NEEDS_ATTENTION,
                               submitted_by=people["shop"], input={"name": "web-csp"})
    step = Step.objects.create(run=stuck, step_id="s1", node="attach_address",
                               status=Step.Status.SUCCEEDED, started_at=stuck.created_at,
                               finished_at=stuck.created_at, done_seq=1)
    Compensation.objects.create(run=stuck, step=step, node="attach_address",
                                idempotency_key="k-csp", status=Compensation.Status.FAILED)
    context = browser.new_context(viewport=WIDE)
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, url, "root")
    policy = page.goto(url + "/").headers["content-security-policy"]
    assert "default-src 'self'" in policy and "unsafe" not in policy
    live(page)  # websockets pass the policy ('self')
    for path in ["/inbox/approvals/", "/inbox/attention/", f"/runs/{stuck.code}/",
                 f"/runs/{stuck.code}/?confirm=resolve",
                 f"/batches/new?action=compensate&runs={stuck.code}", "/outbox/",
                 "/admin/", "/admin/sagas/run/", f"/admin/sagas/run/{stuck.pk}/change/",
                 "/admin/accounts/apikey/add/"]:
        assert page.goto(url + path).headers["content-security-policy"] == policy, path
    page.fill("#id_user", str(people["shop"].pk))  # a raw id field
    page.fill("#id_name", "csp-check")
    page.click("input[name=_save]")
    page.wait_for_selector("input[aria-label='API key']")  # shown once: the created page
    shot(page, "33-admin-key-created")
    page.goto(url + "/api/docs")
    page.wait_for_selector(".swagger-ui .info")
    shot(page, "34-api-docs")
    icon = page.request.get(url + "/favicon.ico")  # as a page's icon, not as a page
    assert icon.status == 200 and icon.headers["content-type"] == "image/x-icon"
    # Chromium asks for it by itself (its own requests are not the page's, so ``browser``
    # does not see them): the server's access log does.
    wait_for(lambda: '"GET /favicon.ico" 200' in site.logs(), 10, "Chromium's favicon",
             site.logs)
    assert '"GET /favicon.ico" 404' not in site.logs()
    context.close()
