"""A Stripe outage while a checkout is undone, in real worker processes (issue 18, item 13): the
refund waits, durably, and is tried again once due (RetryLater, the sweeper), so the run stays
``compensating`` instead of needing a person; Stripe back, it is refunded once. A worker killed
while the run waits, or in the middle of a round, loses nothing. A refund Stripe refuses for good
(a 4xx) needs a person at once. The spent budget: test_checkout_crashes.py."""

from __future__ import annotations

from typing import Any

import stripe

from stateguard_web.runs import services
from stateguard_web.sagas.models import AuditEvent, Compensation, Notification, Run
from tests.conftest import flush_localstripe
from tests.web.conftest import Workers, wait_for
from tests.web.stripe_relay import StripeRelay
from tests.web.test_checkout_crashes import (
    ORDER,
    charges,
    compensation,
    finished,
    refunded_once,
)

FAILED_ORDER = {**ORDER, "fail_booking": True}


def patient(pool: Workers, seconds: int) -> None:
    """The workers wait ``seconds`` between rounds of a refund's attempts (INITIAL = CAP), for
    ten minutes, and e-mail the operators about every run that waits for them."""
    pool.env.update(STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL=str(seconds),
                    STATEGUARD_COMPENSATION_RETRY_LATER_CAP=str(seconds),
                    STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET="600",
                    STATEGUARD_NOTIFY_EMAIL="ops@shop.test", EMAIL_URL="consolemail://")


def outage(relay: StripeRelay) -> Any:
    """Stripe out of reach for the refund: its first call (reading the PaymentIntent) gets no
    answer. The charge, made before, went through."""
    return relay.drop(b"GET /v1/payment_intents/")


def waiting(run: Run) -> Compensation | None:
    """The run's refund, once it waits for its next round (the run still compensating)."""
    run.refresh_from_db()
    comp = Compensation.objects.filter(run=run, status=Compensation.Status.WAITING).first()
    return comp if comp is not None and run.status == Run.Status.COMPENSATING else None


def rounds(comp: Compensation) -> list[list[bool]]:
    """The refund's attempts, round by round (a round starts after its wait)."""
    found: list[list[bool]] = []
    for attempt in comp.attempts.order_by("number"):
        if not found or len(found[-1]) == 5 or found[-1][-1]:
            found.append([])
        found[-1].append(attempt.ok)
    return found


def test_it_waits_out_a_stripe_outage_and_refunds_once_when_stripe_is_back(
        pool: Workers, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    patient(pool, 2)
    down = outage(relay)
    pool.start("w1", beat=True)
    run = services.run_submit(agent="checkout", input=FAILED_ORDER)
    comp = wait_for(lambda: waiting(run), 90, "the refund to wait", pool.logs)
    assert isinstance(comp, Compensation) and comp.retry_at is not None
    assert comp.attempts.count() == 5 and not comp.attempts.filter(ok=True).exists()
    assert charges(stripe_client) == [(42_00, 0)]  # still charged, for now
    # Another round comes while Stripe is still down: it waits again, later.
    wait_for(lambda: comp.attempts.count() >= 10, 60, "a second round", pool.logs)

    relay.lift(down)
    wait_for(lambda: finished(run), 90, "the refund once Stripe is back", pool.logs)

    refunded_once(run, stripe_client)  # the ledger says compensated
    tried = rounds(compensation(run))
    assert len(tried) >= 3 and tried[-1] == [True]
    assert all(r == [False] * 5 for r in tried[:-1])
    assert compensation(run).retry_at is None
    assert not Notification.objects.filter(run=run).exists()  # nobody was called for it
    assert ("sweeper", "run.recovering") not in AuditEvent.objects.filter(run=run).values_list(
        "actor", "action")  # the rounds are no crash's recovery


def test_a_worker_killed_while_the_run_waits_loses_nothing(
        pool: Workers, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    patient(pool, 3)
    down = outage(relay)
    doomed = pool.start("doomed")  # no beat: nothing takes up the next round meanwhile
    run = services.run_submit(agent="checkout", input=FAILED_ORDER)
    comp = wait_for(lambda: waiting(run), 90, "the refund to wait", pool.logs)
    assert isinstance(comp, Compensation) and comp.retry_at is not None
    pool.kill(doomed)
    relay.lift(down)

    pool.start("rescuer", beat=True)
    wait_for(lambda: finished(run), 90, "the next round on another worker", pool.logs)

    refunded_once(run, stripe_client)
    assert rounds(compensation(run)) == [[False] * 5, [True]]
    last = compensation(run).attempts.get(number=6)
    assert last.started_at >= comp.retry_at  # the round came at its time, not before


def test_a_worker_killed_in_the_middle_of_a_round_is_recovered_and_refunds_once(
        pool: Workers, relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    patient(pool, 2)
    down = outage(relay)
    doomed = pool.start("doomed", beat=True)
    run = services.run_submit(agent="checkout", input=FAILED_ORDER)
    wait_for(lambda: waiting(run), 90, "the refund to wait", pool.logs)
    held = relay.hold_request(b"POST /v1/refunds")  # the next round's refund: Stripe never sees it
    relay.lift(down)
    wait_for(held.reached.is_set, 60, "the next round to send its refund", pool.logs)
    pool.start("rescuer", beat=True)
    pool.kill(doomed)
    relay.release()

    wait_for(lambda: finished(run), 90, "recovery to finish the round", pool.logs)

    refunded_once(run, stripe_client)
    assert AuditEvent.objects.filter(run=run, action="run.recovering").exists()


def test_a_refund_stripe_refuses_for_good_needs_attention_after_one_attempt(
        pool: Workers, relay: StripeRelay, localstripe_url: str,
        stripe_client: stripe.StripeClient) -> None:
    patient(pool, 2)
    charged = relay.hold_answer(b"POST /v1/payment_intents")
    pool.start("w1", beat=True)
    run = services.run_submit(agent="checkout", input=FAILED_ORDER)
    wait_for(charged.reached.is_set, 90, "Stripe to charge", pool.logs)
    flush_localstripe(localstripe_url)  # Stripe forgets the charge: its refund is a 404
    relay.release()

    wait_for(lambda: finished(run), 90, "the run to give up", pool.logs)

    assert run.status == Run.Status.NEEDS_ATTENTION
    comp = compensation(run)
    (attempt,) = comp.attempts.all()
    assert (comp.status, comp.retry_at) == (Compensation.Status.FAILED, None)
    assert attempt.error["type"] == "InvalidRequestError"  # localstripe's 404
    wait_for(lambda: Notification.objects.filter(run=run, event="needs_attention").exists(),
             30, "the operators to be told", pool.logs)
