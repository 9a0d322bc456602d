"""The seed's checkout story against localstripe with the real stripe SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from agents.checkout import BookingFailed, checkout_builder, checkout_guard_kwargs
from stateguard import InvalidRunState, SagaAborted, StateGuardCheckpointer
from tests.core.lossy_relay import LossyRelay

ORDER = {"email": "alice@example.com", "amount": 4200, "currency": "usd", "fail_booking": True}


def charges(client: stripe.StripeClient, customer_id: str) -> list[Any]:
    return list(client.v1.charges.list(params={"customer": customer_id}).data)


def test_it_refunds_the_charge_exactly_once_in_the_drop_in_form(
        stripe_client: stripe.StripeClient) -> None:
    refund_calls: list[str] = []

    def no_negative_balance(state: dict[str, Any]) -> bool:
        return int(state.get("amount", 0)) >= 0

    def refund_stripe_charge(state: dict[str, Any], ctx: Any) -> bool:
        # The seed's naive refund (no check first): a second call would refund twice, and
        # localstripe would show it.
        refund_calls.append(ctx.idempotency_key)
        stripe.Refund.create(charge=state["charge_id"], idempotency_key=ctx.idempotency_key)
        return True

    # The seed's snippet, exactly as written.
    checkpointer = StateGuardCheckpointer(
        invariants=[no_negative_balance],
        compensations={'charge_user': refund_stripe_charge},
    )
    graph = checkout_builder(stripe_client).compile(checkpointer=checkpointer)

    with pytest.raises(BookingFailed) as caught:
        graph.invoke(ORDER, {"configurable": {"thread_id": "checkout-1"}})

    state = graph.get_state({"configurable": {"thread_id": "checkout-1"}}).values
    charge = stripe_client.v1.charges.retrieve(state["charge_id"])
    assert charge.amount == 4200
    assert charge.amount_refunded == charge.amount  # refunded, and not twice
    assert caught.value.stateguard_report.compensated == ["charge_user"]  # type: ignore[attr-defined]
    assert len(refund_calls) == 1


def test_it_refunds_once_in_the_guarded_form_and_a_second_unwind_refunds_nothing(
        stripe_client: stripe.StripeClient) -> None:
    guard = StateGuardCheckpointer(**checkout_guard_kwargs(stripe_client))
    graph = guard.compile(checkout_builder(stripe_client))
    config = {"configurable": {"thread_id": "checkout-2"}}

    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, ORDER, config)
    assert isinstance(caught.value.cause, BookingFailed)

    customer_id = graph.get_state(config).values["customer_id"]
    with pytest.raises(InvalidRunState, match="is compensated"):  # "compensate" pressed again
        guard.compensate(graph, config, by="alice")
    (charge,) = charges(stripe_client, customer_id)
    assert (charge.amount, charge.amount_refunded) == (4200, 4200)
    refunds = stripe_client.v1.refunds.list(params={"charge": charge.id}).data
    assert len(refunds) == 1


def test_it_keeps_the_charge_when_the_checkout_succeeds(
        stripe_client: stripe.StripeClient) -> None:
    guard = StateGuardCheckpointer(**checkout_guard_kwargs(stripe_client))
    graph = guard.compile(checkout_builder(stripe_client))
    out = guard.invoke(graph, {**ORDER, "fail_booking": False},
                       {"configurable": {"thread_id": "checkout-3"}})
    charge = stripe_client.v1.charges.retrieve(out["charge_id"])
    assert out["order_id"].startswith("order-") and charge.amount_refunded == 0


@pytest.fixture
def lossy(localstripe_url: str, stripe_client: stripe.StripeClient) -> Iterator[LossyRelay]:
    relay = LossyRelay(localstripe_url)
    yield relay
    relay.close()


def lost_charge_answer(lossy: LossyRelay, run: str) -> tuple[StateGuardCheckpointer, Any]:
    """Run a checkout whose charge reaches Stripe while its answer is lost on the way back."""
    client = stripe.StripeClient("sk_test_stateguard", base_addresses={"api": lossy.url})
    guard = StateGuardCheckpointer(**checkout_guard_kwargs(client))
    graph = guard.compile(checkout_builder(client))
    lossy.lose = b"POST /v1/payment_intents"
    with pytest.raises(stripe.APIConnectionError):  # held for an operator, not unwound
        guard.invoke(graph, {**ORDER, "fail_booking": False}, {"configurable": {"thread_id": run}})
    lossy.lose = None
    assert lossy.lost == 1 and guard.status(run).run.status == "failed"
    return guard, graph


def test_it_refunds_a_charge_whose_answer_was_lost_when_the_operator_compensates(
        lossy: LossyRelay, stripe_client: stripe.StripeClient) -> None:
    guard, graph = lost_charge_answer(lossy, "lost-1")
    (charge,) = stripe_client.v1.charges.list().data  # Stripe did charge the card
    assert charge.amount_refunded == 0

    report = guard.compensate(graph, {"configurable": {"thread_id": "lost-1"}}, by="carol")
    assert {o.node: str(o.status) for o in report.outcomes}["charge_user"] == "succeeded"
    charge = stripe_client.v1.charges.retrieve(charge.id)
    assert charge.amount_refunded == charge.amount  # refunded, and only what was charged
    assert guard.status("lost-1").run.status == "compensated"


def test_it_charges_once_when_a_run_whose_answer_was_lost_is_retried(
        lossy: LossyRelay, stripe_client: stripe.StripeClient) -> None:
    guard, graph = lost_charge_answer(lossy, "lost-2")
    out = guard.retry(graph, {"configurable": {"thread_id": "lost-2"}})

    (charge,) = stripe_client.v1.charges.list().data  # the retry found it: no second charge
    assert out["charge_id"] == charge.id and charge.amount_refunded == 0
    assert guard.status("lost-2").run.status == "succeeded"
