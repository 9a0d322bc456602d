"""The travel agent (an AI agent: create_react_agent with the scripted model) end to end: a run
submitted through the services, executed by a real Celery worker on the test database with
localstripe, each tool call a step of its own in the run's detail."""

from __future__ import annotations

from pathlib import Path

import stripe

from stateguard_web.sagas import selectors, services
from stateguard_web.sagas.models import Run
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
        stripe_client: stripe.StripeClient) -> None:
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
    [refund] = detail["compensations"]
    assert (refund["node"], refund["status"]) == ("charge_card", "succeeded")
    charges = sorted((c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data)
    assert charges == [(31_00, 31_00), (42_00, 0)]  # the failed trip's charge refunded once
    assert len(stripe_client.v1.refunds.list().data) == 1
    assert (sandbox / "outbox").exists() and len(list((sandbox / "outbox").iterdir())) == 1


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
