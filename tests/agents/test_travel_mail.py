"""The travel agent's e-mail, in one process, against a real SMTP server (``mail_server``): a
confirmation and, when the trip is unwound, one apology in reply to it; a send whose answer
was lost (the client timed out waiting for the server's ``250``) is in doubt, and the
apology then asks the server's folder, or, where it cannot (a real mail server), apologises.
A confirmation that fails for now (refused with a 4xx, cut, timed out) is sent again, as the
same message, through a relay that fails it (``bench/fault_relay.py``); the tests of the
apology's decision spend the confirmation's attempts at once (``mail_retried=False``). The crash
of a worker mid-send is in tests/web/test_travel_mail_crash.py."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import stripe

from agents import registry
from agents.mail import MailSettings
from agents.registry import AgentSettings
from bench.fault_relay import SmtpFaultRelay
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
                           replace(mail_server.settings(), timeout=LOST), mail_retried=False)
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
                           replace(mail_server.settings(), timeout=LOST), mail_retried=False)
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
                           replace(mail_server.settings(), timeout=LOST, mail_dir=None),
                           mail_retried=False)
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


def through_relay(mail_server: MailServer, faults: list[str], *, readable: bool
                  ) -> tuple[SmtpFaultRelay, MailSettings]:
    """A relay in front of the server failing its first messages with ``faults``, and the
    settings that send through it; ``readable``: the server's folder names the relay (the
    agents can ask it what the server accepted), else the agents cannot ask."""
    todo = iter(faults)
    relay = SmtpFaultRelay(f"smtp://127.0.0.1:{mail_server.port}",
                           lambda kind: next(todo, None), hang=2 * LOST)
    if readable:
        mail_server.folder.declare_server("127.0.0.1", relay.port)
    return relay, replace(mail_server.settings(), port=relay.port, timeout=LOST,
                          mail_dir=mail_server.folder.path if readable else None)


def confirmation_attempts(guard: Any, config: Any) -> int:
    [step] = [s for s in guard.status(config).steps if s.node == "send_confirmation"]
    return step.attempt


@pytest.mark.parametrize("faults", [["451"], ["451", "451", "451"], ["421"], ["timeout"]])
def test_a_confirmation_refused_for_now_is_sent_again_and_the_trip_is_booked(
        faults: list[str], localstripe_url: str, stripe_client: stripe.StripeClient,
        tmp_path: Path, mail_server: MailServer) -> None:
    # Refused before the server kept it (a 451 to MAIL, RCPT, then DATA; a 421; the message
    # held and never handed over): the server cannot be asked, and need not be.
    relay, settings = through_relay(mail_server, faults, readable=False)
    guard, graph = guarded(localstripe_url, tmp_path, settings)
    config = {"configurable": {"thread_id": "trip-mail-6"}}

    guard.invoke(graph, trip(), config)
    relay.close()

    assert guard.status(config).run.status == RunStatus.SUCCEEDED
    [confirmation] = mail_server.messages(run="trip-mail-6")
    assert confirmation_attempts(guard, config) == len(faults) + 1
    assert ledger(guard, config) == [(confirmation["Message-ID"], "applied", "")]
    assert [charge.refunded for charge in stripe_client.v1.charges.list().data] == [False]


@pytest.mark.parametrize("fault", ["cut", "late"])
def test_a_confirmation_whose_250_was_lost_is_found_at_the_server_and_not_sent_again(
        fault: str, localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    relay, settings = through_relay(mail_server, [fault], readable=True)
    guard, graph = guarded(localstripe_url, tmp_path, settings)
    config = {"configurable": {"thread_id": "trip-mail-7"}}

    guard.invoke(graph, trip(), config)
    relay.close()

    assert guard.status(config).run.status == RunStatus.SUCCEEDED
    [confirmation] = mail_server.messages(run="trip-mail-7")  # kept by the first attempt
    assert confirmation_attempts(guard, config) == 2
    assert ledger(guard, config) == [(confirmation["Message-ID"], "applied", "")]


def test_where_the_server_cannot_be_asked_a_lost_250_sends_the_same_message_again(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        mail_server: MailServer) -> None:
    # The rule where the server cannot be asked (docs/deploy.md, "E-mail"): at least once, as
    # the same message. The server holds two copies of one Message-ID, the ledger one e-mail.
    relay, settings = through_relay(mail_server, ["cut"], readable=False)
    guard, graph = guarded(localstripe_url, tmp_path, settings)
    config = {"configurable": {"thread_id": "trip-mail-8"}}

    guard.invoke(graph, trip(), config)
    relay.close()

    assert guard.status(config).run.status == RunStatus.SUCCEEDED
    first, second = mail_server.messages(run="trip-mail-8")
    assert first["Message-ID"] == second["Message-ID"]
    assert ledger(guard, config) == [(first["Message-ID"], "applied", "")]


def test_it_refuses_to_run_the_travel_agent_without_a_mail_server(tmp_path: Path) -> None:
    settings = AgentSettings(stripe_api_key=STRIPE_TEST_KEY, stripe_api_base="http://x",
                             sandbox_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="agent 'travel' e-mails its customers"):
        registry.get("travel", settings)
