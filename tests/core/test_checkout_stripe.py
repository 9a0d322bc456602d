"""The seed's checkout story against localstripe with the real stripe SDK."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import stripe

from agents.checkout import BookingFailed, checkout_builder, checkout_guard_kwargs
from stateguard import InvalidRunState, SagaAborted, StateGuardCheckpointer, StateGuardWarning

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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StateGuardWarning)
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
