"""agents/mail.py and agents/mailbox.py: e-mail over SMTP to a real server (``mail_server``:
make run's handler in aiosmtpd), Message-IDs made from idempotency keys, and the folder the
local server keeps, which answers whether it accepted a message."""

from __future__ import annotations

import json
import smtplib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from agents.mail import Mailer, MailSettings, domain_of, mail_unsure
from agents.mailbox import MailFolder, digest_of
from stateguard import ConfigurationError
from tests.conftest import _free_port
from tests.mail_server import MailServer


def test_it_names_a_message_by_its_idempotency_key_at_the_senders_domain(
        mail_server: MailServer) -> None:
    mailer = Mailer(mail_server.settings())
    assert mailer.message_id("sg-effect-0123abcd") == "<sg-effect-0123abcd@shop.test>"
    with pytest.raises(ConfigurationError, match="not an idempotency key"):
        mailer.message_id("a key>\r\nBcc: everyone@example.com")


def test_it_sends_over_smtp_and_the_server_keeps_the_message_with_its_envelope(
        mail_server: MailServer) -> None:
    mailer = Mailer(mail_server.settings())
    first = mailer.message_id("sg-effect-1")
    assert mailer.accepted(first) is False

    mailer.send(mailer.compose(to="alice@example.com", subject="Booked", body="Lisbon.\n.\n",
                               message_id=first, run="run-1"))
    reply = mailer.message_id("sg-2")
    mailer.send(mailer.compose(to="alice@example.com", subject="Cancelled:\r\n  Lisbon",
                               body="Sorry.", message_id=reply, run="run-1",
                               in_reply_to=first))

    assert mailer.accepted(first) is True and mailer.accepted(reply) is True
    booked, cancelled = mail_server.messages(run="run-1")
    assert (booked["Message-ID"], booked["From"], booked["To"]) == (
        first, "StateGuard <stateguard@shop.test>", "alice@example.com")
    assert booked["Return-Path"] == "<stateguard@shop.test>"  # the envelope, kept first
    assert booked["X-Original-To"] == "alice@example.com"
    assert booked.get_content() == "Lisbon.\n.\n"  # a line of one dot survives the protocol
    assert (cancelled["In-Reply-To"], cancelled["References"]) == (first, first)
    assert cancelled["Subject"] == "Cancelled: Lisbon"  # one line, whatever it was given
    assert [m.digest for m in mail_server.folder.find(first)] == [digest_of(first)]


def test_it_cannot_tell_what_a_server_accepted_unless_that_server_keeps_the_folder(
        mail_server: MailServer, tmp_path: Path) -> None:
    settings = mail_server.settings()
    mailer = Mailer(settings)
    message_id = mailer.message_id("sg-effect-3")
    mailer.send(mailer.compose(to="bob@example.com", subject="Hi", body=".",
                               message_id=message_id, run="run-3"))

    assert Mailer(replace(settings, mail_dir=None)).accepted(message_id) is None
    # Another server's mail: its folder says nothing about what this one accepted.
    other = replace(settings, port=settings.port + 1 if settings.port < 65535 else 1)
    assert Mailer(other).accepted(message_id) is None
    assert Mailer(replace(settings, host="localhost")).accepted(message_id) is True
    (tmp_path / "mail" / "server.json").write_text("not json")
    assert mailer.accepted(message_id) is None


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")  # a test server
def test_it_logs_in_when_given_a_user_to_a_server_that_asks_for_one(
        tmp_path: Path) -> None:
    folder = MailFolder(tmp_path / "mail")

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            folder.deliver(envelope.original_content, mail_from=envelope.mail_from,
                           rcpt_tos=envelope.rcpt_tos)
            return "250 OK"

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str,
                     data: Any) -> AuthResult:
        good = isinstance(data, LoginPassword) and (data.login, data.password) == (
            b"agent", b"s3cret")
        return AuthResult(success=good)

    port = _free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port,  # plain: a test
                            server_hostname="localhost", authenticator=authenticate,
                            auth_required=True, auth_require_tls=False)
    controller.start()
    try:
        settings = MailSettings(host="127.0.0.1", port=port, from_email="sg@shop.test",
                                timeout=5, username="agent", password="s3cret")
        assert "s3cret" not in repr(settings)
        mailer = Mailer(settings)
        mailer.send(mailer.compose(to="carol@example.com", subject="Hi", body="x",
                                   message_id=mailer.message_id("sg-4"), run="run-4"))
        with pytest.raises(smtplib.SMTPSenderRefused, match="Authentication required"):
            Mailer(replace(settings, username="")).send(mailer.compose(
                to="carol@example.com", subject="Hi", body="x",
                message_id=mailer.message_id("sg-5"), run="run-4"))
    finally:
        controller.stop()
    assert [m.digest for m in folder.messages()] == [digest_of("<sg-4@shop.test>")]


@pytest.mark.parametrize(("changes", "error"), [
    ({"use_tls": True, "use_ssl": True}, "not both"),
    ({"from_email": "StateGuard"}, "is not an address"),
    ({"port": 0}, "not a host and a port"),
    ({"host": ""}, "not a host and a port"),
    ({"timeout": 0}, "above 0"),
])
def test_it_refuses_mail_settings_that_cannot_work(changes: dict[str, Any], error: str) -> None:
    good = {"host": "127.0.0.1", "port": 25, "from_email": "sg@shop.test", "timeout": 5}
    with pytest.raises(ConfigurationError, match=error):
        MailSettings(**{**good, **changes})


@pytest.mark.parametrize(("exc", "unsure"), [
    (smtplib.SMTPServerDisconnected("Connection unexpectedly closed: timed out"), True),
    (ConnectionRefusedError(111, "Connection refused"), True),
    (TimeoutError("timed out"), True),
    (smtplib.SMTPSenderRefused(451, b"4.3.0 try later", "sg@shop.test"), True),
    (smtplib.SMTPDataError(421, b"closing"), True),
    (smtplib.SMTPRecipientsRefused({"a@x.test": (550, b"no"), "b@x.test": (450, b"busy")}),
     True),
    (smtplib.SMTPRecipientsRefused({"a@x.test": (550, b"no such user")}), False),
    (smtplib.SMTPDataError(554, b"rejected"), False),
    (smtplib.SMTPNotSupportedError("SMTPUTF8 not supported"), False),
    (ValueError("not an address"), False),
])
def test_it_tells_a_send_that_may_succeed_later_from_one_refused_for_good(
        exc: BaseException, unsure: bool) -> None:
    assert mail_unsure(exc) is unsure


def test_it_reads_the_domain_of_an_address() -> None:
    assert domain_of("StateGuard <stateguard@shop.test>") == "shop.test"
    assert domain_of("ops@example.com") == "example.com"
    assert domain_of("nobody") == domain_of("x@") == domain_of("x@do/main") == ""


def test_the_folder_keeps_each_delivery_and_names_the_server_that_writes_it(
        tmp_path: Path) -> None:
    folder = MailFolder(tmp_path)
    data = b"Message-ID: <m1@shop.test>\r\nSubject: Hi\r\n\r\nHello\r\n"
    first = folder.deliver(data, mail_from="a@shop.test\r\nX-Evil: 1", rcpt_tos=["b@x.test"])
    again = folder.deliver(data, mail_from="a@shop.test", rcpt_tos=["b@x.test"])
    other = folder.deliver(b"Subject: no id\r\n\r\n.", mail_from="", rcpt_tos=["c@x.test"])

    assert [m.name for m in folder.messages()] == [other.name, again.name, first.name]
    assert [m.name for m in folder.find("<m1@shop.test>")] == [first.name, again.name]
    assert folder.find("<m2@shop.test>") == []
    assert "X-Evil" not in first.headers()  # the envelope cannot add a header
    assert first.headers()["Return-Path"] == "<a@shop.test X-Evil: 1>"
    assert other.digest == "0" * 16
    assert not folder.serves("127.0.0.1", 8025)  # no server declared yet
    folder.declare_server("127.0.0.1", 8025)
    assert json.loads((tmp_path / "server.json").read_text()) == {
        "host": "127.0.0.1", "port": 8025}
    assert folder.serves("localhost", 8025) and not folder.serves("smtp.example.com", 8025)
    (tmp_path / "notes.txt").write_text("not a message")
    assert len(folder.messages()) == 3  # what is not a message is not listed
    assert MailFolder(tmp_path / "missing").messages() == []
