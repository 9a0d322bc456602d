"""The travel agent in one process: create_react_agent with the scripted model, its tools on
localstripe, a sandbox and a real SMTP server (``mail_server``), guarded as the web app guards
it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import stripe

from agents import registry
from agents.mail import MailSettings
from agents.registry import AgentSettings
from agents.travel import ScriptedTravelModel, chat_model
from stateguard import CompensationStatus, RunStatus, SagaAborted, StateGuardCheckpointer
from tests.conftest import STRIPE_TEST_KEY, flush_localstripe
from tests.mail_server import MailServer


def guarded(localstripe_url: str, sandbox: Path, mail: MailSettings, *,
            mail_retried: bool = True) -> tuple[StateGuardCheckpointer, Any]:
    """The travel agent's guard and graph; ``mail_retried=False``: a confirmation that fails
    is not sent again (as if its attempts were spent at once)."""
    spec = registry.get("travel", AgentSettings(stripe_api_key=STRIPE_TEST_KEY,
                                                stripe_api_base=localstripe_url,
                                                sandbox_dir=sandbox, mail=mail))
    if not mail_retried:
        spec = replace(spec, kinds={})
    guard = StateGuardCheckpointer(**spec.guard_kwargs())
    return guard, guard.compile(spec.build())


def trip(destination: str = "Lisbon", amount: int = 420_00 // 10) -> dict[str, Any]:
    return {"email": "alice@example.com", "destination": destination, "nights": 2,
            "amount": amount, "currency": "usd"}


def log(sandbox: Path) -> list[str]:
    path = sandbox / "effects.log"
    return [line.split(":")[0] + ":" + line.split(":")[1] for line in
            path.read_text().split()] if path.exists() else []


def test_it_books_a_trip_one_tool_call_at_a_time(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
    config = {"configurable": {"thread_id": "trip-1"}}

    out = guard.invoke(graph, trip(), config)

    assert out["messages"][-1].content == "Your trip to Lisbon is booked."
    view = guard.status(config)
    assert view.run.status == RunStatus.SUCCEEDED
    tools = [(s.node, s.status) for s in sorted(view.steps, key=lambda s: s.done_seq or 0)
             if s.node not in ("agent", "tools")]
    assert tools == [("charge_card", "succeeded"), ("reserve_hotel", "succeeded"),
                     ("send_confirmation", "succeeded")]
    assert log(tmp_path) == ["do:charge", "do:reserve", "do:mail"]
    assert [(c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data] == [
        (42_00, 0)]
    [confirmation] = mail_server.messages(run="trip-1")
    assert (confirmation["To"], confirmation["Subject"]) == ("alice@example.com",
                                                             "Your trip to Lisbon")
    [effect] = [e for e in view.effects if e.effect.provider == "smtp"]
    assert (effect.effect.kind, effect.effect.external_id, effect.status) == (
        "email", confirmation["Message-ID"], "applied")
    assert effect.effect.idempotency_key in confirmation["Message-ID"]  # named by the call


def test_it_refunds_the_charge_once_when_no_room_can_be_held(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
    config = {"configurable": {"thread_id": "trip-2"}}

    with pytest.raises(SagaAborted, match="no hotel has rooms in Atlantis"):
        guard.invoke(graph, trip("Atlantis"), config)

    [charge] = stripe_client.v1.charges.list().data
    assert (charge.amount, charge.amount_refunded) == (42_00, 42_00)
    assert len(stripe_client.v1.refunds.list().data) == 1
    view = guard.status(config)
    assert view.run.status == RunStatus.COMPENSATED
    assert [(e.effect.kind, e.status) for e in view.effects] == [
        ("charge", "compensated"), ("refund", "compensated")]
    assert log(tmp_path) == ["do:charge", "undo:charge"]


def test_it_hands_a_refund_stripe_refuses_for_good_to_a_person_after_one_attempt(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
    config = {"configurable": {"thread_id": "trip-gone"}}
    guard.invoke(graph, trip(), config)
    flush_localstripe(localstripe_url)  # Stripe no longer knows the charge: a 404, for good

    report = guard.compensate(graph, config, by="olivia")

    assert report.needs_attention
    comps = {c.node: c for c in guard.status(config).compensations}
    refund = comps["charge_card"]
    assert (refund.status, len(refund.attempts)) == (CompensationStatus.FAILED, 1)
    assert refund.attempts[0].error is not None
    assert refund.attempts[0].error.type == "InvalidRequestError"
    assert comps["reserve_hotel"].status == CompensationStatus.SUCCEEDED  # the others still ran


def test_it_asks_before_a_charge_over_100(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
    config = {"configurable": {"thread_id": "trip-3"}}

    guard.invoke(graph, trip(amount=250_00), config)
    [approval] = guard.status(config).pending_approvals
    assert approval.payload["args"] == {"amount": 250_00, "currency": "usd",
                                        "email": "alice@example.com"}
    assert stripe_client.v1.charges.list().data == []

    guard.reject(graph, config, by="bob", reason="too much")
    assert stripe_client.v1.charges.list().data == []
    assert guard.status(config).run.status == RunStatus.COMPENSATED


def test_it_uses_the_scripted_model_unless_a_provider_is_named() -> None:
    assert isinstance(chat_model(""), ScriptedTravelModel)
    with pytest.raises(ValueError, match="unknown provider"):
        chat_model("acme:model-1")
