"""Checkout in real worker processes against localstripe: the money is charged once, refunded
once or not at all, and the effect ledger says so, when booking fails, when Stripe refuses a
refund, and when a worker is SIGKILLed inside a Stripe call (issue 10).

A relay between the workers and localstripe (``tests/web/stripe_relay.py``) pins a worker at an
exact point: it holds a request before Stripe sees it, or holds Stripe's answer after Stripe
acted, until the test has killed the worker. The agent's code has no test hook.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import stripe

from stateguard_web.runs import services
from stateguard_web.sagas.models import AuditEvent, Compensation, Effect, Run
from tests.web.conftest import ManagePy, Workers, wait_for
from tests.web.stripe_relay import Rule, StripeRelay

ORDER = {"email": "alice@example.com", "amount": 42_00}
DONE = {Run.Status.SUCCEEDED, Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION}


def finished(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.status in DONE else None


def charges(client: stripe.StripeClient) -> list[tuple[int, int]]:
    return [(c.amount, c.amount_refunded) for c in client.v1.charges.list().data]


def intent_id(client: stripe.StripeClient) -> str:
    (intent,) = client.v1.payment_intents.list().data
    return str(intent.id)


def ledger(run: Run) -> list[tuple[str, str, int | None, str, str]]:
    return [(e.kind, e.external_id, e.amount, e.status, e.undoes)
            for e in Effect.objects.filter(run=run).order_by("kind")]


def refund_of(client: stripe.StripeClient) -> Any:
    (refund,) = client.v1.refunds.list().data  # one refund, never two
    return refund


def compensation(run: Run) -> Compensation:
    comp: Compensation = Compensation.objects.get(run=run, node="charge_user")
    return comp


def booked_once(run: Run, client: stripe.StripeClient) -> None:
    """The run succeeded: one charge, kept and booked; the ledger holds it ``applied``."""
    assert run.status == Run.Status.SUCCEEDED
    assert charges(client) == [(42_00, 0)]
    assert client.v1.refunds.list().data == []
    pi = intent_id(client)
    assert run.steps.get(node="book_order").update == {"order_id": f"order-{pi}"}
    assert ledger(run) == [("charge", pi, 42_00, "applied", "")]


def refunded_once(run: Run, client: stripe.StripeClient) -> Any:
    """The run was unwound: one charge, refunded once and in full (``amount_refunded ==
    amount``: a second refund would show, localstripe takes it); the ledger holds the charge
    ``compensated`` and the refund that undoes it. The refund."""
    assert run.status == Run.Status.COMPENSATED
    assert charges(client) == [(42_00, 42_00)]
    refund, pi = refund_of(client), intent_id(client)
    assert ledger(run) == [("charge", pi, 42_00, "compensated", ""),
                           ("refund", refund.id, 42_00, "compensated", pi)]
    assert compensation(run).status == Compensation.Status.SUCCEEDED
    assert refund.metadata["stateguard_run"] == str(run.code)
    assert refund.metadata["stateguard_compensation"] == compensation(run).idempotency_key
    return refund


def kill_at(pool: Workers, relay: StripeRelay, hold: Rule, input: dict[str, Any],
            on_crash: str = "unwind") -> tuple[Run, float]:
    """Submit a checkout to one worker, SIGKILL it once ``hold`` has pinned it, and let a
    second worker (with the beat) recover the run, with the deployment's ``on_crash`` for
    checkout; the run, finished, and the seconds from the kill to its end."""
    doomed = pool.start("doomed")
    run = services.run_submit(agent="checkout", input=input, by="alice")
    wait_for(hold.reached.is_set, 90, "the worker to reach the held Stripe call", pool.logs)
    if on_crash != "unwind":  # checkout's own policy is unwind
        pool.env["STATEGUARD_ON_CRASH"] = f"checkout={on_crash}"
    # Started before the kill, to boot meanwhile: it takes nothing from the live worker,
    # which renews its lease while it waits for Stripe.
    pool.start("rescuer", beat=True)
    pool.kill(doomed)
    killed_at = time.monotonic()
    relay.release()  # a held request is dropped: Stripe never sees it
    wait_for(lambda: finished(run), 90, "recovery to finish the run", pool.logs)
    took = time.monotonic() - killed_at
    assert AuditEvent.objects.get(run=run, action="run.recovering").data["policy"] == on_crash
    return run, took


def test_the_deployment_sets_an_agents_crash_policy_over_its_own(settings: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from stateguard_web.runs.runtime import agent_spec

    assert agent_spec("checkout").on_crash == "unwind"  # the agent's own
    settings.STATEGUARD_ON_CRASH = {"checkout": "resume"}
    assert (agent_spec("checkout").on_crash, agent_spec("provision").on_crash) == (
        "resume", "unwind")
    settings.STATEGUARD_ON_CRASH = {"chekout": "resume"}  # a typo must not go unnoticed
    with pytest.raises(ImproperlyConfigured, match="names no agent: \\['chekout'\\]"):
        agent_spec("checkout")


def test_it_refuses_a_crash_policy_other_than_unwind_or_resume(manage_py: ManagePy) -> None:
    result = manage_py("check", env={"STATEGUARD_ON_CRASH": "checkout=retry"})
    assert result.returncode != 0
    assert "STATEGUARD_ON_CRASH: {'checkout': 'retry'}" in result.stderr


def test_it_charges_once_books_and_keeps_the_charge_applied(
        pool: Workers, stripe_client: stripe.StripeClient) -> None:
    pool.start("w1")
    run = services.run_submit(agent="checkout", input=ORDER, by="alice")
    wait_for(lambda: finished(run), 90, "the run to finish", pool.logs)
    booked_once(run, stripe_client)


def test_it_refunds_a_failed_booking_once_and_the_ledger_says_compensated(
        pool: Workers, stripe_client: stripe.StripeClient) -> None:
    pool.start("w1")
    run = services.run_submit(agent="checkout", input={**ORDER, "fail_booking": True})
    wait_for(lambda: finished(run), 90, "the run to be unwound", pool.logs)

    refund = refunded_once(run, stripe_client)
    (attempt,) = compensation(run).attempts.all()
    assert attempt.result == repr(f"refunded {refund.id}: 4200 usd")


def test_it_retries_a_refund_that_stripe_failed_and_refunds_once(
        pool: Workers, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    failing = relay.fail(b"POST /v1/refunds", times=2)
    pool.start("w1")
    run = services.run_submit(agent="checkout", input={**ORDER, "fail_booking": True})
    wait_for(lambda: finished(run), 90, "the run to be unwound", pool.logs)

    refunded_once(run, stripe_client)
    assert failing.seen == 2
    assert [(a.number, a.ok) for a in compensation(run).attempts.order_by("number")] == [
        (1, False), (2, False), (3, True)]


def test_it_needs_attention_once_stripe_refused_every_refund_for_its_whole_budget(
        pool: Workers, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    # A refund waits out an outage between rounds of five attempts (test_checkout_outage.py),
    # here for 3 s: past that, nobody waits any more, and a person takes the run over.
    pool.env.update(STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL="1",
                    STATEGUARD_COMPENSATION_RETRY_LATER_CAP="1",
                    STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET="3")
    failing = relay.fail(b"POST /v1/refunds")
    pool.start("w1", beat=True)  # its sweeper starts the rounds
    run = services.run_submit(agent="checkout", input={**ORDER, "fail_booking": True})
    wait_for(lambda: finished(run), 90, "the run to give up", pool.logs)

    assert run.status == Run.Status.NEEDS_ATTENTION
    comp = compensation(run)
    attempts = comp.attempts.count()
    assert (comp.status, comp.retry_at, failing.seen) == ("failed", None, attempts)
    assert attempts >= 10 and attempts % 5 == 0  # rounds of five, two at least
    first, last = comp.attempts.first(), comp.attempts.last()
    assert first is not None and last is not None
    assert last.finished_at - first.started_at >= timedelta(seconds=3)  # the budget, spent
    assert {a.error["type"] for a in comp.attempts.all()} == {"APIError"}
    assert charges(stripe_client) == [(42_00, 0)]  # still charged: for an operator
    assert ledger(run) == [("charge", intent_id(stripe_client), 42_00, "applied", "")]


@pytest.mark.parametrize("on_crash", ["unwind", "resume"])
@pytest.mark.parametrize("charged", [True, False], ids=["stripe-charged", "stripe-never-saw-it"])
def test_a_worker_killed_inside_charge_user_leaves_one_charge_refunded_or_booked_or_none(
        charged: bool, on_crash: str, pool: Workers, relay: StripeRelay,
        stripe_client: stripe.StripeClient) -> None:
    # Charged: Stripe created the PaymentIntent (and charged the card), its answer never
    # reached the worker, which died in charge_user: nothing but Stripe knows of the charge.
    # Not charged: the request never reached Stripe, and the worker died waiting.
    hold = (relay.hold_answer if charged else relay.hold_request)(b"POST /v1/payment_intents")
    run, took = kill_at(pool, relay, hold, ORDER, on_crash)
    print(f"charged={charged}, {on_crash}: the run finished {took:.1f} s after SIGKILL")

    if on_crash == "resume":
        booked_once(run, stripe_client)  # the resumed charge_user found it, or charged once
    elif charged:
        refunded_once(run, stripe_client)  # the in-doubt step's refund found the charge
    else:
        assert run.status == Run.Status.COMPENSATED
        assert stripe_client.v1.payment_intents.list().data == []
        assert charges(stripe_client) == []
        assert compensation(run).status == Compensation.Status.NOTHING_TO_UNDO
        assert ledger(run) == []


def test_a_worker_killed_after_stripe_refunded_is_not_refunded_again_and_the_ledger_shows_it(
        pool: Workers, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    # The refund went through at Stripe; its answer never reached the worker, which died
    # before it could record it.
    hold = relay.hold_answer(b"POST /v1/refunds")
    run, took = kill_at(pool, relay, hold, {**ORDER, "fail_booking": True})
    print(f"refund answer held: the run finished {took:.1f} s after SIGKILL")

    refund = refunded_once(run, stripe_client)
    # The dead worker's attempt was never journaled; the recovering one found its refund and
    # says which attempt made it and how much: the undo is done, not "nothing to undo".
    assert [a.result for a in compensation(run).attempts.all()] == [
        repr(f"found {refund.id}: 4200 usd refunded by attempt 1")]
