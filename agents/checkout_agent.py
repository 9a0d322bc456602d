"""Registers the Stripe checkout agent (``agents.checkout``) with the web app's registry."""

from __future__ import annotations

import os
from typing import Any

import stripe
from pydantic import BaseModel, ConfigDict, Field

from agents.checkout import charged_within_amount, checkout_builder, refund_compensation
from agents.registry import AgentSpec, register


class CheckoutInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: str = Field(max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    amount: int = Field(gt=0, le=1_000_000_00)  # smallest currency unit
    currency: str = Field(default="usd", pattern=r"^[a-z]{3}$")
    fail_booking: bool = False


def stripe_client() -> stripe.StripeClient:
    return stripe.StripeClient(os.environ.get("STRIPE_API_KEY", "sk_test_local"),
                               base_addresses={"api": os.environ.get(
                                   "STRIPE_API_BASE", "http://127.0.0.1:8420")})


@register("checkout")
def spec() -> AgentSpec:
    client = stripe_client()

    def build() -> Any:
        return checkout_builder(client)

    return AgentSpec(
        name="checkout", build=build, input_schema=CheckoutInput,
        invariants=(charged_within_amount,),
        compensations={"payment": refund_compensation(client)},
        approvals={"charge_user": lambda s: int(s.get("amount", 0)) > 100_00},
        description="Charge a card with Stripe, then book the order; refund if booking fails.")
