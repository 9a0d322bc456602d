"""Reads for refunds: a charge of the ledger as Stripe and the ledger see it now."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import stripe
from django.db.models import QuerySet, Sum

from stateguard_web.payments.stripe_client import charge_id_of, money
from stateguard_web.sagas.models import Effect, Run

__all__ = ["ChargeState", "ChargeUnreadable", "charge_state", "ledger_refunded", "refundable",
           "run_charges", "stripe_charge", "stripe_error_message"]

STRIPE = "stripe"


class ChargeUnreadable(LookupError):
    """Stripe could not tell us about the charge (its message is written for the operator)."""


def run_charges(*, run: Run) -> QuerySet[Effect]:
    """The run's Stripe charges in the ledger, oldest first (the order refunds lock them in)."""
    return run.effects.filter(provider=STRIPE, kind="charge").order_by("pk")


def refundable(effect: Effect) -> bool:
    """Whether the ledger offers ``effect`` for a refund by hand: a Stripe charge that it does
    not hold refunded in full. (What may be refunded is Stripe's to say, when asked.)"""
    return (effect.provider == STRIPE and effect.kind == "charge"
            and effect.status != Effect.Status.COMPENSATED)


def ledger_refunded(*, effect: Effect) -> int:
    """What the ledger records as refunded of ``effect`` (the effects that undo it)."""
    total = Effect.objects.filter(provider=effect.provider, undoes=effect.external_id).aggregate(
        total=Sum("amount"))["total"]
    return int(total or 0)


def stripe_error_message(exc: stripe.StripeError) -> str:
    """Stripe's own words for the operator (the SDK's network errors are pages long)."""
    if isinstance(exc, stripe.APIConnectionError):
        return "Stripe could not be reached, or its answer was lost (a network error)"
    said = (exc.user_message or str(exc) or type(exc).__name__).strip()
    status = f" (HTTP {exc.http_status})" if exc.http_status else ""
    return f"Stripe answered with an error{status}: {said}"


def stripe_charge(client: stripe.StripeClient, external_id: str) -> Any:
    """The Stripe Charge that a ledger id names: a PaymentIntent's latest charge (``pi_...``,
    what the checkout agent records) or a charge itself (``ch_...``), read now."""
    try:
        if external_id.startswith("pi_"):
            intent = client.v1.payment_intents.retrieve(external_id)
            charge_id = charge_id_of(intent)
            if charge_id is None:
                raise ChargeUnreadable(f"PaymentIntent {external_id} has no charge at Stripe "
                                       f"(it is {intent.status})")
        elif external_id.startswith(("ch_", "py_")):
            charge_id = external_id
        else:
            raise ChargeUnreadable(f"{external_id!r} is not a Stripe charge or PaymentIntent id")
        return client.v1.charges.retrieve(charge_id)
    except stripe.StripeError as exc:
        raise ChargeUnreadable(f"{external_id}: {stripe_error_message(exc)}") from exc


@dataclass(frozen=True, slots=True)
class ChargeState:
    """A ledger charge, with what Stripe says of it now."""

    effect: Effect
    charge_id: str  # Stripe's ch_... (the ledger may name the PaymentIntent)
    charge_status: str
    charged: int  # at Stripe, smallest unit
    refunded: int  # at Stripe (amount_refunded)
    ledger_refunded: int
    currency: str

    @property
    def remaining(self) -> int:
        """What may be refunded now: what Stripe charged less what it refunded, and never more
        than what the ledger recorded less the refunds it holds (whatever the provider would
        accept: localstripe takes over-refunds). Nothing for a charge that did not succeed."""
        if self.charge_status != "succeeded":
            return 0
        recorded = self.charged if self.effect.amount is None else self.effect.amount
        return max(0, min(self.charged - self.refunded, recorded - self.ledger_refunded))

    def show(self, amount: int | None) -> str:
        return money(amount, self.currency)

    # For templates, which cannot pass an argument.
    show_charged = property(lambda self: self.show(self.charged))
    show_refunded = property(lambda self: self.show(self.refunded))
    show_ledger_refunded = property(lambda self: self.show(self.ledger_refunded))
    show_remaining = property(lambda self: self.show(self.remaining))


def charge_state(*, effect: Effect, client: stripe.StripeClient) -> ChargeState:
    """Read ``effect`` (a Stripe charge of the ledger) at Stripe now; ``ChargeUnreadable``
    when Stripe cannot say."""
    if effect.provider != STRIPE or effect.kind != "charge":
        raise ChargeUnreadable(f"{effect.external_id} is a {effect.provider} {effect.kind}, "
                               "not a Stripe charge: only charges are refunded here")
    charge = stripe_charge(client, effect.external_id)
    return ChargeState(effect=effect, charge_id=str(charge.id), charge_status=str(charge.status),
                       charged=int(charge.amount), refunded=int(charge.amount_refunded or 0),
                       ledger_refunded=ledger_refunded(effect=effect),
                       currency=str(charge.currency or effect.currency))
