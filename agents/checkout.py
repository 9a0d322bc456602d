"""The checkout agent: charge the customer with Stripe, then book the order.

The seed story StateGuard exists for: if anything after the charge fails (booking, an invariant,
an operator's rejection), the charge is refunded exactly once, with an idempotency key that stays
the same on every retry, and only after checking what Stripe already refunded.

Not every error is a reason to unwind: a Stripe call that did not get through is tried again
(the SDK resends a read and the keyed customer; ``create_customer`` and ``charge_user`` run
again, the charge after looking for itself: ``agents/stripe_support.py``), and when Stripe stays
out of reach the run is held ``failed`` (``checkout_error_policy``) so that an operator can
retry it once Stripe answers again.

A charge whose answer was lost may have happened. So the PaymentIntent names its run in its
metadata, and both the charge and the refund look for it before they act: a retry reuses the
charge it finds (Stripe keeps idempotency keys for 24 hours only, and the local stand-in not at
all), and the refund, which may run for a failed or in-doubt step (it is ``in_doubt_safe``),
refunds what it finds and what is left of it, never more.

Every charge and refund goes into the journal's effect ledger (``record_effect``), keyed by the
PaymentIntent's id (a refund ``undoes`` it). A process can die between Stripe's answer and the
record, so whoever finds one records it: the refund records the charge it finds, and the
refunds its own earlier attempts made (their metadata names the run and the compensation's
idempotency key).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypedDict

import stripe
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from pydantic import Field

from agents.registry import AgentInput, AgentSettings, AgentSpec, register, run_id
from agents.stripe_support import (
    REFUND_RETRY,
    stripe_client,
    stripe_step_kinds,
    stripe_unsure,
)
from stateguard import Compensation, Effect, ExceptionContext, record_effect


class CheckoutState(TypedDict, total=False):
    email: str
    amount: int  # in the currency's smallest unit (cents)
    currency: str
    customer_id: str
    payment_intent_id: str
    charge_id: str
    amount_charged: int
    order_id: str
    fail_booking: bool  # lets the demo and tests make the booking fail


class BookingFailed(Exception):
    pass


def charged_within_amount(state: dict[str, Any]) -> bool:
    """The customer is never charged more than the order amount."""
    return int(state.get("amount_charged", 0)) <= int(state.get("amount", 0))


def checkout_error_policy(exc: BaseException) -> Literal["compensate", "hold"]:
    """``on_error`` for checkout: hold the run on an error that a retry may fix, unwind it on a
    business error (a declined card, a failed booking), which a retry would only repeat.

    Held (``stripe_unsure``), once the step's own attempts are spent: Stripe was unreachable
    (``APIConnectionError``: the request may or may not have reached it; a retry looks for the
    charge first and sends the same idempotency key, so Stripe acts once), asked us to slow
    down (``RateLimitError``: nothing was done), or failed on its side (``APIError``, a 5xx:
    the outcome is unknown, so a person looks before anything is undone)."""
    return "hold" if stripe_unsure(exc) else "compensate"


RUN_KEY, STEP_KEY = "stateguard_run", "stateguard_step"
# A refund's metadata names its run (RUN_KEY), the compensation that made it (its idempotency
# key), the key its request sent and the attempt that sent it.
UNDO_KEY, REQUEST_KEY = "stateguard_compensation", "stateguard_idempotency_key"
ATTEMPT_KEY = "stateguard_attempt"
# No blind resend of a charge or a refund by the SDK after a lost answer: a retry goes through
# the lookup first (the node's, or the compensation's next attempt), which holds beyond
# Stripe's 24-hour idempotency window and on stand-ins that keep no idempotency keys.
_ONCE: Any = {"max_network_retries": 0}


def find_charge(client: stripe.StripeClient, customer_id: str, run: str) -> Any | None:
    """The succeeded PaymentIntent this run's ``charge_user`` made, if any (by its metadata)."""
    intents = client.v1.payment_intents.list(params={"customer": customer_id, "limit": 100})
    for intent in intents.auto_paging_iter():
        metadata = _metadata(intent)
        if (metadata.get(RUN_KEY) == run and metadata.get(STEP_KEY) == "charge_user"
                and intent.status == "succeeded"):
            return intent
    return None


def _charge_id(intent: Any) -> str:
    latest = intent.latest_charge  # an id on Stripe, an expanded object on localstripe
    return str(latest if isinstance(latest, str) else latest.id)


def _metadata(obj: Any) -> dict[str, Any]:
    return obj.metadata.to_dict() if obj.metadata else {}


def _charge_key(run: str) -> str:
    return f"stateguard:{run}:charge_user"


def record_charge(intent: Any, run: str) -> None:
    """The ledger's record of the charge: the PaymentIntent, by its id (once, however often
    it is found)."""
    record_effect(Effect("stripe", "charge", intent.id, amount=int(intent.amount),
                         currency=str(intent.currency), idempotency_key=_charge_key(run)))


def _record_refund(refund: Any, intent: Any, key: str) -> None:
    record_effect(Effect("stripe", "refund", refund.id, amount=int(refund.amount),
                         currency=str(refund.currency), idempotency_key=key, undoes=intent.id))


def checkout_builder(client: stripe.StripeClient,
                     book: Callable[[dict[str, Any]], str] | None = None
                     ) -> StateGraph[Any, Any, Any, Any]:
    # The idempotency keys name the run and the node: a retry of a held run repeats the call
    # with the same key, and Stripe returns what it did the first time, if it did anything.
    def create_customer(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        customer = client.v1.customers.create(
            params={"email": state["email"]},
            options={"idempotency_key": f"stateguard:{run_id(config)}:create_customer"})
        return {"customer_id": customer.id}

    def charge_user(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        run = run_id(config)
        intent = find_charge(client, state["customer_id"], run)
        if intent is None:
            intent = client.v1.payment_intents.create(params={
                "amount": state["amount"], "currency": state.get("currency", "usd"),
                "customer": state["customer_id"], "payment_method": "pm_card_visa",
                "confirm": True, "metadata": {RUN_KEY: run, STEP_KEY: "charge_user"}},
                options=_ONCE | {"idempotency_key": _charge_key(run)})
        record_charge(intent, run)  # also one it found: its first run may have died unrecorded
        return {"payment_intent_id": intent.id, "charge_id": _charge_id(intent),
                "amount_charged": intent.amount}

    def book_order(state: dict[str, Any]) -> dict[str, Any]:
        if state.get("fail_booking"):
            raise BookingFailed("the warehouse rejected the order")
        return {"order_id": book(state) if book else f"order-{state['payment_intent_id']}"}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(CheckoutState)
    builder.add_node("create_customer", create_customer)
    builder.add_node("charge_user", charge_user, metadata={"tags": ["payment"]})
    builder.add_node("book_order", book_order)
    builder.add_edge(START, "create_customer")
    builder.add_edge("create_customer", "charge_user")
    builder.add_edge("charge_user", "book_order")
    builder.add_edge("book_order", END)
    return builder


def refund_compensation(client: stripe.StripeClient) -> Compensation:
    """Refund what is left of the charge: find it, check Stripe, refund with a stable key.

    ``in_doubt_safe``: it acts only on a charge it finds, so it also runs for a ``charge_user``
    that failed or was cut off mid-way, whose charge may exist without its id in the state.

    Returns what it did (journaled as the attempt's result): the refund it made, or the
    refunds an earlier attempt of this compensation made (found by their metadata: that
    attempt's process died before it recorded them, or its answer was lost); falsy when there
    was no charge, or someone else (an admin) had refunded all of it."""

    def refund_stripe_charge(state: dict[str, Any], ctx: ExceptionContext) -> str | bool:
        state = state or {}
        intent: Any = None
        if state.get("payment_intent_id"):
            intent = client.v1.payment_intents.retrieve(state["payment_intent_id"])
        elif state.get("customer_id"):
            intent = find_charge(client, state["customer_id"], ctx.run_id)
        if intent is None:
            return False  # the charge never happened: nothing to undo
        record_charge(intent, ctx.run_id)  # the charge step may have died before it did
        charge_id = _charge_id(intent)
        ours = [r for r in client.v1.refunds.list(params={"charge": charge_id, "limit": 100})
                .auto_paging_iter() if _metadata(r).get(UNDO_KEY) == ctx.idempotency_key]
        made = [r for r in ours if r.status not in ("failed", "canceled")]
        for refund in made:  # an earlier attempt's, perhaps never recorded
            _record_refund(refund, intent, _metadata(refund).get(REQUEST_KEY, ""))
        charge = client.v1.charges.retrieve(charge_id)
        # What Stripe says is left, never more: localstripe would accept a refund beyond it.
        remaining = charge.amount - (charge.amount_refunded or 0)
        if remaining <= 0:
            if not made:
                return False  # refunded in full by someone else (an admin, by hand)
            return "; ".join(f"found {r.id}: {r.amount} {r.currency} refunded by attempt "
                             f"{_metadata(r).get(ATTEMPT_KEY, '?')}" for r in made)
        # The first refund sends the compensation's key. Another one (a refund of ours failed
        # at the bank and gave the money back) needs a key of its own: Stripe would answer the
        # first key with the first refund.
        key = ctx.idempotency_key + (f":{len(ours) + 1}" if ours else "")
        refund = client.v1.refunds.create(
            params={"charge": charge_id, "amount": remaining,
                    "metadata": {RUN_KEY: ctx.run_id, "reason": ctx.reason,
                                 UNDO_KEY: ctx.idempotency_key, REQUEST_KEY: key,
                                 ATTEMPT_KEY: str(ctx.attempt)}},
            options=_ONCE | {"idempotency_key": key})
        _record_refund(refund, intent, key)
        return f"refunded {refund.id}: {refund.amount} {refund.currency}"

    return Compensation(refund_stripe_charge, retry=REFUND_RETRY, in_doubt_safe=True)


def checkout_guard_kwargs(client: stripe.StripeClient) -> dict[str, Any]:
    """The invariants, compensations and error policy to give a ``StateGuardCheckpointer``."""
    return {"invariants": [charged_within_amount],
            "compensations": {"payment": refund_compensation(client)},
            "on_error": checkout_error_policy}


# -- registered with the web app ----------------------------------------------------------
class CheckoutInput(AgentInput):
    email: str = Field(max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    amount: int = Field(gt=0, le=1_000_000_00)  # smallest currency unit
    currency: str = Field(default="usd", pattern=r"^[a-z]{3}$")
    fail_booking: bool = False


@register("checkout", version="1")
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
        # Before that, its Stripe steps try again on their own while Stripe does not answer:
        # the customer by its idempotency key, the charge after looking for it.
        kinds=stripe_step_kinds(settings, "create_customer", "charge_user"),
        description="Charge a card with Stripe, then book the order; refund if booking fails.")
