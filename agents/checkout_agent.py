"""Registers the Stripe checkout agent (``agents.checkout``) with the web app's registry."""

from __future__ import annotations

from typing import Any

import stripe
from pydantic import Field

from agents.checkout import checkout_builder, checkout_guard_kwargs
from agents.registry import AgentInput, AgentSettings, AgentSpec, register


class CheckoutInput(AgentInput):
    email: str = Field(max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    amount: int = Field(gt=0, le=1_000_000_00)  # smallest currency unit
    currency: str = Field(default="usd", pattern=r"^[a-z]{3}$")
    fail_booking: bool = False


def stripe_client(settings: AgentSettings) -> stripe.StripeClient:
    return stripe.StripeClient(settings.stripe_api_key,
                               base_addresses={"api": settings.stripe_api_base})


@register("checkout")
def spec(settings: AgentSettings) -> AgentSpec:
    client = stripe_client(settings)
    guard = checkout_guard_kwargs(client)

    def build() -> Any:
        return checkout_builder(client)

    return AgentSpec(
        name="checkout", build=build, input_schema=CheckoutInput,
        invariants=tuple(guard["invariants"]), compensations=guard["compensations"],
        approvals={"charge_user": lambda s: int(s.get("amount", 0)) > 100_00},
        # Hold on Stripe's transient errors so an operator can retry; unwind on the rest.
        on_error=guard["on_error"],
        description="Charge a card with Stripe, then book the order; refund if booking fails.")
