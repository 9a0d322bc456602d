"""The travel agent (an AI agent: create_react_agent with the scripted model) end to end: a run
submitted through the services, executed by a real Celery worker (or in this process, as one
would) on the test database with localstripe, each tool call a step of its own in the run's
detail, in the API and on the dashboard."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import stripe
from django.test import Client

from stateguard_web.accounts import services as accounts
from stateguard_web.runs import selectors, services, tasks
from stateguard_web.sagas.models import Run
from tests.mail_server import MailServer
from tests.web.api.world import make_user
from tests.web.conftest import Workers, wait_for


def settled(run: Run, status: str) -> bool:
    run.refresh_from_db()
    return run.status == status


def tool_steps(run: Run) -> list[tuple[str, str]]:
    detail = selectors.run_detail(run=selectors.run_get(code=run.code, detail=True))
    return [(s["node"], s["status"]) for s in detail["steps"]
            if s["node"] not in ("agent", "tools")]


def test_it_runs_the_travel_agent_on_a_worker_one_tool_call_per_step(
        workers: Workers, sandbox: Path, localstripe_url: str,
        stripe_client: stripe.StripeClient, mail_server: MailServer) -> None:
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY="sk_test_stateguard")
    workers.start("w1")
    booked = services.run_submit(agent="travel", by="alice", input={
        "email": "alice@example.com", "destination": "Lisbon", "nights": 2, "amount": 42_00})
    failed = services.run_submit(agent="travel", by="alice", input={
        "email": "bob@example.com", "destination": "Atlantis", "nights": 1, "amount": 31_00})

    wait_for(lambda: settled(booked, Run.Status.SUCCEEDED), 60, "the trip to be booked",
             workers.logs)
    wait_for(lambda: settled(failed, Run.Status.COMPENSATED), 60, "the trip to be unwound",
             workers.logs)

    assert tool_steps(booked) == [("charge_card", "succeeded"), ("reserve_hotel", "succeeded"),
                                  ("send_confirmation", "succeeded")]
    assert tool_steps(failed) == [("charge_card", "succeeded"), ("reserve_hotel", "failed")]
    detail = selectors.run_detail(run=selectors.run_get(code=failed.code, detail=True))
    [charge] = [s for s in detail["steps"] if s["node"] == "charge_card"]
    assert charge["update"]["args"] == {"amount": 31_00, "currency": "usd",
                                        "email": "bob@example.com"}
    # The failed reservation's cancel looked for a room (it is in_doubt_safe) and found none.
    assert {c["node"]: c["status"] for c in detail["compensations"]} == {
        "charge_card": "succeeded", "reserve_hotel": "nothing_to_undo"}
    charges = sorted((c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data)
    assert charges == [(31_00, 31_00), (42_00, 0)]  # the failed trip's charge refunded once
    assert len(stripe_client.v1.refunds.list().data) == 1
    # The booked trip's confirmation, over SMTP; none for the failed one (it got no further).
    [confirmation] = mail_server.messages()
    assert (confirmation["X-StateGuard-Run"], confirmation["To"]) == (
        str(booked.code), "alice@example.com")


def test_it_waits_for_an_operator_before_a_charge_over_100_and_charges_once(
        workers: Workers, sandbox: Path, localstripe_url: str,
        stripe_client: stripe.StripeClient) -> None:
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY="sk_test_stateguard")
    workers.start("w1")
    run = services.run_submit(agent="travel", by="alice", input={
        "email": "carol@example.com", "destination": "Oslo", "nights": 3, "amount": 250_00})
    wait_for(lambda: settled(run, Run.Status.PAUSED), 60, "the charge's gate", workers.logs)

    [approval] = run.approvals.all()
    # the operator sees the call the model asked for, before it runs
    assert approval.node == "charge_card"
    assert approval.payload["args"] == {"amount": 250_00, "currency": "usd",
                                        "email": "carol@example.com"}
    assert stripe_client.v1.charges.list().data == []

    services.run_approve(run=run, by="bob")
    wait_for(lambda: settled(run, Run.Status.SUCCEEDED), 60, "the trip to be booked",
             workers.logs)
    assert [(c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data] == [
        (250_00, 0)]
    assert tool_steps(run) == [("charge_card", "succeeded"), ("reserve_hotel", "succeeded"),
                               ("send_confirmation", "succeeded")]


def test_it_shows_the_tools_step_paused_at_the_charges_gate_as_paused_not_failed(
        transactional_db: None, settings: Any, tmp_path: Path, localstripe_url: str,
        mail_server: MailServer) -> None:
    settings.STRIPE_API_KEY, settings.STRIPE_API_BASE = "sk_test_stateguard", localstripe_url
    settings.STATEGUARD_SANDBOX_DIR = str(tmp_path)
    mail_server.use_in(settings)
    alice = make_user("alice", "submitter")
    run = services.run_submit(agent="travel", by=alice, input={
        "email": "carol@example.com", "destination": "Oslo", "nights": 3, "amount": 250_00})
    tasks.run_execute(run.pk)  # in this process, as a worker would: the charge's gate pauses
    assert settled(run, Run.Status.PAUSED)

    # The API: the tools step that paused inside, at the gate, is waiting, with no error.
    _, key = accounts.api_key_create(user=alice, name="laptop")
    response = Client().get(f"/api/runs/{run.code}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    steps = response.json()["steps"]
    [tools] = [s for s in steps if s["status"] != "succeeded"]
    assert (tools["node"], tools["status"], tools["error"]) == ("tools", "paused", None)

    # The dashboard: its timeline item and its node in the graph say paused, in "wait" colour.
    page = Client()
    page.force_login(alice)
    html = page.get(f"/runs/{run.code}/").content.decode()
    [item] = re.findall(r'<li class="timeline-item[^>]*data-node="tools".*?</li>', html, re.S)
    assert 'class="timeline-item st-wait"' in item and 'data-status="paused"' in item
    assert ('<span class="badge st-wait" data-status="paused"><span aria-hidden="true">‖</span>'
            ' paused</span>') in item
    assert "Error" not in item and 'data-status="failed"' not in html
    assert '<g class="graph-node st-wait" data-node="tools"><title>tools: paused<' in html

    # Approved and carried out, the paused step runs again from its start and succeeds.
    services.run_approve(run=run, by="bob")
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])  # as a worker would, from the queue
    assert settled(run, Run.Status.SUCCEEDED)
    resumed = run.steps.get(step_id=tools["step_id"])
    assert (resumed.status, resumed.attempt, resumed.prev_status) == ("succeeded", 2, "paused")
    assert tool_steps(run) == [("charge_card", "succeeded"), ("reserve_hotel", "succeeded"),
                               ("send_confirmation", "succeeded")]
