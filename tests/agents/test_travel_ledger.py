"""The travel agent's ledger when Stripe's answer is lost on the way back (the provider acted,
the caller never heard): the refund that finds the charge records it, and a refund an earlier
attempt made is recorded by the next one. ``r1_chaos.py --agent travel`` found both missing
from the ledger, a worker killed between Stripe's answer and ``record_effect``."""

from __future__ import annotations

from pathlib import Path

import pytest
import stripe

from agents import registry
from agents.registry import AgentSettings
from stateguard import SagaAborted, StateGuardCheckpointer
from tests.agents.test_travel import trip
from tests.conftest import STRIPE_TEST_KEY
from tests.core.lossy_relay import LossyRelay
from tests.core.test_checkout_ledger import ledger, only
from tests.core.test_checkout_stripe import lossy
from tests.mail_server import MailServer

__all__ = ["lossy"]  # the fixture


def run_trip(lossy: LossyRelay, tmp_path: Path, mail_server: MailServer, run: str,
             destination: str) -> StateGuardCheckpointer:
    spec = registry.get("travel", AgentSettings(stripe_api_key=STRIPE_TEST_KEY,
                                                stripe_api_base=lossy.url,
                                                sandbox_dir=tmp_path / "sandbox",
                                                mail=mail_server.settings()))
    guard = StateGuardCheckpointer(**spec.guard_kwargs())
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(spec.build()), trip(destination),
                     {"configurable": {"thread_id": run}})
    return guard


def test_a_charge_whose_answer_was_lost_is_recorded_by_the_refund_that_finds_it(
        lossy: LossyRelay, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    lossy.lose = b"POST /v1/payment_intents"  # Stripe charges; charge_card never hears

    guard = run_trip(lossy, tmp_path, mail_server, "trip-lost-charge", "Lisbon")

    charge = only(stripe_client.v1.charges.list().data)
    refund = only(stripe_client.v1.refunds.list().data)
    assert (lossy.lost, charge.amount_refunded) == (1, charge.amount)
    assert ledger(guard, "trip-lost-charge") == [
        ("charge", charge.payment_intent, 4200, "compensated", ""),
        ("refund", refund.id, 4200, "compensated", charge.payment_intent)]
    [recorded] = [e for e in guard.status("trip-lost-charge").effects
                  if e.effect.kind == "charge"]
    assert recorded.effect.idempotency_key == (
        "stateguard:trip-lost-charge:charge_card:call_charge_card")  # the call's own key


def test_a_refund_whose_answer_was_lost_is_found_by_the_next_attempt_not_made_again(
        lossy: LossyRelay, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    lossy.lose = b"POST /v1/refunds"  # Stripe refunds; the compensation never hears

    guard = run_trip(lossy, tmp_path, mail_server, "trip-lost-refund", "Atlantis")

    charge = only(stripe_client.v1.charges.list().data)
    refund = only(stripe_client.v1.refunds.list().data)
    assert (lossy.lost, charge.amount_refunded) == (1, charge.amount)
    comp = only(c for c in guard.status("trip-lost-refund").compensations
                if c.node == "charge_card")
    assert [(a.number, a.ok, a.error.type if a.error else a.result) for a in comp.attempts] == [
        (1, False, "APIConnectionError"),
        (2, True, repr(f"found {refund.id}: 4200 usd refunded by an earlier attempt"))]
    assert ledger(guard, "trip-lost-refund") == [
        ("charge", charge.payment_intent, 4200, "compensated", ""),
        ("refund", refund.id, 4200, "compensated", charge.payment_intent)]
