"""Checkout's effect ledger in one process, against localstripe: every charge and refund is
recorded once, also when its answer was lost and a later call finds it (issue 10). The same
with real worker processes killed mid-call: tests/web/test_checkout_crashes.py."""

from __future__ import annotations

from typing import Any

import pytest
import stripe

from agents.checkout import BookingFailed, checkout_builder, checkout_guard_kwargs
from stateguard import SagaAborted, StateGuardCheckpointer
from tests.core.lossy_relay import LossyRelay
from tests.core.test_checkout_stripe import ORDER, lossy, lost_charge_answer

__all__ = ["lossy"]  # the fixture, shared with test_checkout_stripe


def ledger(guard: StateGuardCheckpointer, run: str) -> list[tuple[str, str, int | None, str, str]]:
    return sorted((e.effect.kind, e.effect.external_id, e.effect.amount, str(e.status),
                   e.effect.undoes) for e in guard.status(run).effects)


def only(items: Any) -> Any:
    (item,) = items
    return item


def test_a_refund_whose_answer_was_lost_is_found_by_the_next_attempt_not_made_again(
        lossy: LossyRelay, stripe_client: stripe.StripeClient) -> None:
    client = stripe.StripeClient("sk_test_stateguard", base_addresses={"api": lossy.url})
    guard = StateGuardCheckpointer(**checkout_guard_kwargs(client))
    lossy.lose = b"POST /v1/refunds"  # Stripe refunds; the answer never comes back
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(checkout_builder(client)), ORDER,
                     {"configurable": {"thread_id": "lost-refund"}})

    charge = only(stripe_client.v1.charges.list().data)
    refund = only(stripe_client.v1.refunds.list().data)
    assert (lossy.lost, charge.amount_refunded) == (1, charge.amount)
    comp = only(guard.status("lost-refund").compensations)
    assert [(a.number, a.ok, a.error.type if a.error else a.result) for a in comp.attempts] == [
        (1, False, "APIConnectionError"),
        (2, True, repr(f"found {refund.id}: 4200 usd refunded by attempt 1"))]
    assert ledger(guard, "lost-refund") == [
        ("charge", charge.payment_intent, 4200, "compensated", ""),
        ("refund", refund.id, 4200, "compensated", charge.payment_intent)]
    assert only(e.effect.idempotency_key for e in guard.status("lost-refund").effects
                if e.effect.kind == "refund") == comp.idempotency_key


def test_a_charge_whose_answer_was_lost_is_recorded_by_the_refund_that_finds_it(
        lossy: LossyRelay, stripe_client: stripe.StripeClient) -> None:
    guard, graph = lost_charge_answer(lossy, "lost-l1")
    assert guard.status("lost-l1").effects == []  # the node never heard of its charge

    guard.compensate(graph, {"configurable": {"thread_id": "lost-l1"}}, by="carol")
    charge = only(stripe_client.v1.charges.list().data)
    refund = only(stripe_client.v1.refunds.list().data)
    assert ledger(guard, "lost-l1") == [
        ("charge", charge.payment_intent, 4200, "compensated", ""),
        ("refund", refund.id, 4200, "compensated", charge.payment_intent)]


def test_the_retry_of_a_charge_whose_answer_was_lost_records_the_charge_it_finds(
        lossy: LossyRelay, stripe_client: stripe.StripeClient) -> None:
    guard, graph = lost_charge_answer(lossy, "lost-l2")
    guard.retry(graph, {"configurable": {"thread_id": "lost-l2"}})
    charge = only(stripe_client.v1.charges.list().data)
    assert ledger(guard, "lost-l2") == [("charge", charge.payment_intent, 4200, "applied", "")]
    assert only(guard.status("lost-l2").effects).effect.idempotency_key == (
        "stateguard:lost-l2:charge_user")


def test_it_refunds_only_what_is_left_of_a_charge_someone_refunded_in_part(
        stripe_client: stripe.StripeClient) -> None:
    def refund_some_by_hand_then_fail(state: dict[str, Any]) -> str:
        stripe_client.v1.refunds.create(params={"charge": state["charge_id"], "amount": 1000})
        raise BookingFailed("the warehouse rejected the order")

    guard = StateGuardCheckpointer(**checkout_guard_kwargs(stripe_client))
    graph = guard.compile(checkout_builder(stripe_client, book=refund_some_by_hand_then_fail))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {**ORDER, "fail_booking": False},
                     {"configurable": {"thread_id": "partly"}})

    charge = only(stripe_client.v1.charges.list().data)
    assert (charge.amount, charge.amount_refunded) == (4200, 4200)  # never more (localstripe
    refunds = stripe_client.v1.refunds.list().data                  # would take 8400)
    assert sorted(r.amount for r in refunds) == [1000, 3200]
    ours = only(r for r in refunds if r.amount == 3200)
    # The ledger holds what StateGuard did; the refund by hand is the reconciliation's to find.
    assert ledger(guard, "partly") == [
        ("charge", charge.payment_intent, 4200, "partially_compensated", ""),
        ("refund", ours.id, 3200, "compensated", charge.payment_intent)]
