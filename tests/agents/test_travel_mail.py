"""The travel agent's e-mail, in one process, against a real SMTP server (``mail_server``): a
confirmation and, when the trip is unwound, one apology in reply to it; a send whose answer
was lost (the client timed out waiting for the server's ``250``) is in doubt, and the
apology then asks the server's folder, or, where it cannot (a real mail server), apologises.
The crash of a worker mid-send is in tests/web/test_travel_mail_crash.py."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import stripe

from agents import registry
from agents.registry import AgentSettings
from stateguard import CompensationStatus, ConfigurationError, RunStatus, SagaAborted
from tests.agents.test_travel import guarded, trip
from tests.conftest import STRIPE_TEST_KEY
from tests.mail_server import MailServer

LOST = 0.5  # seconds a client waits for the server's answer before it gives up: in doubt
LOST_ANSWER = r"SMTPServerDisconnected: .*timed out"  # what smtplib raises then


def ledger(guard: Any, config: Any) -> list[tuple[str, str, str]]:
    return [(e.effect.external_id, str(e.status), e.effect.undoes)
            for e in guard.status(config).effects if e.effect.provider == "smtp"]


def apology_of(guard: Any, config: Any) -> Any:
    [comp] = [c for c in guard.status(config).compensations if c.node == "send_confirmation"]
    return comp


def test_an_unwound_trip_sends_one_confirmation_and_one_apology_in_reply_to_it(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
    config = {"configurable": {"thread_id": "trip-mail-1"}}
    guard.invoke(graph, trip(), config)

    report = guard.compensate(graph, config, by="olivia")

    assert not report.needs_attention
    confirmation, apology = mail_server.messages(run="trip-mail-1")
    assert confirmation["Subject"] == "Your trip to Lisbon"
    assert (apology["Subject"], apology["To"]) == ("Cancelled: your trip to Lisbon",
                                                   "alice@example.com")
    first = confirmation["Message-ID"]
    assert apology["In-Reply-To"] == apology["References"] == first
    comp = apology_of(guard, config)
    assert apology["Message-ID"] == f"<{comp.idempotency_key}@shop.test>"  # the undo's key
    assert ledger(guard, config) == [(first, "compensated", ""),
                                     (apology["Message-ID"], "compensated", first)]
    assert guard.status(config).run.status == RunStatus.COMPENSATED


def test_an_apology_whose_answer_was_lost_is_found_by_the_next_attempt_and_not_resent(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path,
                           replace(mail_server.settings(), timeout=LOST))
    config = {"configurable": {"thread_id": "trip-mail-2"}}
    guard.invoke(graph, trip(), config)
    mail_server.hold(b"Subject: Cancelled", accepted=True)  # kept; the 250 never comes

    guard.compensate(graph, config, by="olivia")

    confirmation, apology = mail_server.messages(run="trip-mail-2")  # one apology
    comp = apology_of(guard, config)
    assert comp.status == CompensationStatus.SUCCEEDED
    assert [a.error.type if a.error else None for a in comp.attempts] == [
        "SMTPServerDisconnected", None]
    assert ledger(guard, config) == [
        (confirmation["Message-ID"], "compensated", ""),
        (apology["Message-ID"], "compensated", confirmation["Message-ID"])]


def test_a_confirmation_whose_answer_was_lost_is_apologised_for_once(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path,
                           replace(mail_server.settings(), timeout=LOST))
    config = {"configurable": {"thread_id": "trip-mail-3"}}
    mail_server.hold(b"Subject: Your trip", accepted=True)

    with pytest.raises(SagaAborted, match=LOST_ANSWER):
        guard.invoke(graph, trip(), config)

    confirmation, apology = mail_server.messages(run="trip-mail-3")
    assert apology["In-Reply-To"] == confirmation["Message-ID"]
    # The call raised before it could record its e-mail: the apology found it at the
    # server and recorded it, then itself.
    assert ledger(guard, config) == [
        (confirmation["Message-ID"], "compensated", ""),
        (apology["Message-ID"], "compensated", confirmation["Message-ID"])]
    [charge] = stripe_client.v1.charges.list().data
    assert charge.amount_refunded == charge.amount


def test_a_confirmation_the_server_never_accepted_is_not_apologised_for(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    guard, graph = guarded(localstripe_url, tmp_path,
                           replace(mail_server.settings(), timeout=LOST))
    config = {"configurable": {"thread_id": "trip-mail-4"}}
    mail_server.hold(b"Subject: Your trip", accepted=False)  # then refused: never kept

    with pytest.raises(SagaAborted, match=LOST_ANSWER):
        guard.invoke(graph, trip(), config)

    assert mail_server.messages(run="trip-mail-4") == []
    assert apology_of(guard, config).status == CompensationStatus.NOTHING_TO_UNDO
    assert ledger(guard, config) == []
    assert guard.status(config).run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("accepted", [True, False])
def test_where_the_server_cannot_be_asked_a_send_in_doubt_is_apologised_for(
        accepted: bool, localstripe_url: str, stripe_client: stripe.StripeClient,
        tmp_path: Path, mail_server: MailServer) -> None:
    # A real mail server keeps no folder this process can read: whether it accepted the
    # confirmation cannot be known, and the rule is to apologise (docs/deploy.md, "E-mail").
    guard, graph = guarded(localstripe_url, tmp_path,
                           replace(mail_server.settings(), timeout=LOST, mail_dir=None))
    config = {"configurable": {"thread_id": f"trip-mail-5-{accepted}"}}
    mail_server.hold(b"Subject: Your trip", accepted=accepted)

    with pytest.raises(SagaAborted, match=LOST_ANSWER):
        guard.invoke(graph, trip(), config)

    sent = mail_server.messages(run=f"trip-mail-5-{accepted}")
    assert [m["Subject"] for m in sent] == ["Your trip to Lisbon"] * accepted + [
        "Cancelled: your trip to Lisbon"]
    apology = sent[-1]
    # In reply to the confirmation, by the Message-ID the call gave it, or would have.
    assert re.fullmatch(r"<sg-effect-[0-9a-f]{32}@shop\.test>", apology["In-Reply-To"])
    assert apology["In-Reply-To"] == sent[0]["Message-ID"] or not accepted
    # Not known to be sent, so not recorded as sent; the apology is, naming what it undoes.
    assert ledger(guard, config) == [(apology["Message-ID"], "compensated",
                                      apology["In-Reply-To"])]


def test_it_refuses_to_run_the_travel_agent_without_a_mail_server(tmp_path: Path) -> None:
    settings = AgentSettings(stripe_api_key=STRIPE_TEST_KEY, stripe_api_base="http://x",
                             sandbox_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="agent 'travel' e-mails its customers"):
        registry.get("travel", settings)
