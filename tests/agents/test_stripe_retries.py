"""A Stripe that fails now and then (issue 22, fault 1): the agents' client retries what is safe
to send again and gives up on a silent Stripe in time; checkout's charge, whose answer was lost,
is looked up and not made twice when its step runs again (agents/stripe_support.py).

Through a relay in front of localstripe that fails the requests it is told to."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import stripe

from agents import registry
from agents.registry import AgentSettings
from agents.stripe_support import STRIPE_STEP_RETRY, stripe_client, stripe_step_kinds
from stateguard import StateGuardCheckpointer
from tests.conftest import STRIPE_TEST_KEY
from tests.web.stripe_relay import StripeRelay


def settings(base: str, *, retries: int, timeout: float = 30.0) -> AgentSettings:
    return AgentSettings(stripe_api_key=STRIPE_TEST_KEY, stripe_api_base=base,
                         sandbox_dir=Path("/nonexistent"), stripe_max_network_retries=retries,
                         stripe_timeout=timeout)


@pytest.fixture
def relay(localstripe_url: str, stripe_client: stripe.StripeClient) -> Iterator[StripeRelay]:
    relay = StripeRelay(localstripe_url)  # stripe_client: localstripe emptied first
    yield relay
    relay.close()


def test_it_retries_a_read_that_failed_and_gives_up_on_a_silent_stripe(
        relay: StripeRelay) -> None:
    failed, dropped = relay.fail(b"GET /v1/customers", 1), relay.drop(b"GET /v1/customers", 1)
    assert stripe_client(settings(relay.url, retries=2)).v1.customers.list().data == []
    assert failed.seen == dropped.seen == 1  # a 500, then no answer, then Stripe's

    relay.hold_request(b"GET /v1/charges")  # Stripe never answers
    started = time.monotonic()
    with pytest.raises(stripe.APIConnectionError, match="timed out"):
        stripe_client(settings(relay.url, retries=0, timeout=0.3)).v1.charges.list()
    assert time.monotonic() - started < 5


def test_it_charges_once_when_the_charges_answer_is_lost_and_its_step_runs_again(
        relay: StripeRelay, stripe_client: stripe.StripeClient) -> None:
    lookup = relay.fail(b"GET /v1/payment_intents", 1)  # the SDK sends the read again
    lost = relay.cut(b"POST /v1/payment_intents", 1)  # Stripe charges; the answer is lost
    spec = registry.get("checkout", settings(relay.url, retries=1))
    guard = StateGuardCheckpointer(**spec.guard_kwargs())
    run = {"configurable": {"thread_id": "lost-answer"}}

    out = guard.invoke(guard.compile(spec.build()),
                       {"email": "alice@example.com", "amount": 4200}, run)

    (charge,) = stripe_client.v1.charges.list().data  # one: the step found the first
    assert (charge.id, charge.amount, charge.amount_refunded) == (out["charge_id"], 4200, 0)
    assert lookup.seen == lost.seen == 1
    assert guard.status("lost-answer").run.status == "succeeded"
    assert {s.node: s.attempt for s in guard.status("lost-answer").steps} == {
        "create_customer": 1, "charge_user": 2, "book_order": 1}


def test_it_retries_steps_only_on_errors_without_a_verdict_and_only_if_told_to() -> None:
    assert not STRIPE_STEP_RETRY.is_permanent(stripe.APIConnectionError("no answer"))
    assert not STRIPE_STEP_RETRY.is_permanent(stripe.APIError("oops", http_status=500))
    assert STRIPE_STEP_RETRY.is_permanent(stripe.CardError("declined", "card", "declined"))
    assert stripe_step_kinds(settings("http://x", retries=0), "charge_user") == {}
    assert set(stripe_step_kinds(settings("http://x", retries=2), "charge_user")) == {
        "charge_user"}
