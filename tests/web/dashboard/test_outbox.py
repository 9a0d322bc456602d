"""The Outbox (dashboard/outbox.py) through Django's test client: the mail server's folder,
newest first, each message with its run; one message; and the run page's ledger linking to
it. Per role: operators and viewers read it, a submitter may not, and nobody where the
deployment names no folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agents.mailbox import MailFolder, digest_of
from stateguard_web.sagas.models import Effect, Run
from tests.web.api.world import make_user


def mail(folder: MailFolder, message_id: str, subject: str, *, run: str = "",
         in_reply_to: str = "", body: str = "Hello.") -> str:
    headers = ["From: StateGuard <sg@shop.test>", "To: alice@example.com",
               f"Subject: {subject}", f"Message-ID: {message_id}"]
    headers += [f"In-Reply-To: {in_reply_to}"] * bool(in_reply_to)
    headers += [f"X-StateGuard-Run: {run}"] * bool(run)
    folder.deliver(("\r\n".join(headers) + f"\r\n\r\n{body}\r\n").encode(),
                   mail_from="sg@shop.test", rcpt_tos=["alice@example.com"])
    return digest_of(message_id)


@pytest.fixture
def folder(settings: Any, tmp_path: Path) -> MailFolder:
    settings.STATEGUARD_MAIL_DIR = tmp_path / "mail"
    return MailFolder(tmp_path / "mail")


def client_of(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_it_lists_the_servers_mail_newest_first_each_with_its_run(folder: MailFolder) -> None:
    olivia, shop = make_user("olivia", "operator"), make_user("shop", "submitter")
    run = Run.objects.create(agent="travel", submitted_by=shop)
    booked = mail(folder, "<sg-effect-1@shop.test>", "Your trip to Lisbon", run=str(run.code))
    cancelled = mail(folder, "<sg-2@shop.test>", "Cancelled: <b>Lisbon</b>", run=str(run.code),
                     in_reply_to="<sg-effect-1@shop.test>")
    mail(folder, "<other@shop.test>", "No run of ours",
         run="00000000-0000-0000-0000-000000000000")

    html = client_of(olivia).get("/outbox/").content.decode()

    rows = html.split('<tr data-mail="')[1:]
    assert [r.split('"')[0] for r in rows] == [digest_of("<other@shop.test>"), cancelled, booked]
    assert f'href="/runs/{run.code}/"' in rows[1] and f'href="/runs/{run.code}/"' in rows[2]
    assert "/runs/" not in rows[0]  # it names no run there is
    assert f'data-reply-to="{booked}"' in rows[1]
    assert "Cancelled: &lt;b&gt;Lisbon&lt;/b&gt;" in rows[1]  # text, never markup
    assert 'href="/outbox/"' in html and 'aria-current="page">Outbox' in html  # the nav's
    assert "3 messages" in html


@pytest.mark.django_db
def test_it_shows_one_message_with_its_reply_link_and_says_when_it_was_accepted_twice(
        folder: MailFolder) -> None:
    vera = make_user("vera", "viewer")
    first = mail(folder, "<sg-effect-1@shop.test>", "Your trip", body="Booked.\n<i>x</i>")
    mail(folder, "<sg-effect-1@shop.test>", "Your trip", body="Booked.\n<i>x</i>")
    reply = mail(folder, "<sg-2@shop.test>", "Cancelled", in_reply_to="<sg-effect-1@shop.test>")
    client = client_of(vera)

    html = client.get(f"/outbox/{first}/").content.decode()
    assert "<code data-message-id>&lt;sg-effect-1@shop.test&gt;</code>" in html
    assert "Booked.\n&lt;i&gt;x&lt;/i&gt;" in html
    assert 'data-deliveries="2"' in html  # a message sent twice shows it
    html = client.get(f"/outbox/{reply}/").content.decode()
    assert f'href="/outbox/{first}/" data-in-reply-to' in html
    assert "data-deliveries" not in html
    assert client.get("/outbox/0123456789abcdef/").status_code == 404
    assert client.get("/outbox/not-a-digest/").status_code == 404


@pytest.mark.django_db
def test_it_is_for_those_who_see_every_run_and_only_where_a_folder_is_named(
        folder: MailFolder, settings: Any) -> None:
    shop, olivia = make_user("shop", "submitter"), make_user("olivia", "operator")
    digest = mail(folder, "<m@shop.test>", "Hi")
    assert client_of(shop).get("/outbox/").status_code == 403
    assert client_of(shop).get(f"/outbox/{digest}/").status_code == 403
    assert 'href="/outbox/"' not in client_of(shop).get("/").content.decode()
    assert Client().get("/outbox/").status_code == 302  # to the login page

    settings.STATEGUARD_MAIL_DIR = None  # a real mail server: no folder to read
    client = client_of(olivia)
    assert client.get("/outbox/").status_code == 404
    assert 'href="/outbox/"' not in client.get("/").content.decode()


@pytest.mark.django_db
def test_it_pages_a_long_outbox_and_says_when_there_is_none(folder: MailFolder) -> None:
    client = client_of(make_user("olivia", "operator"))
    assert "No e-mail yet" in client.get("/outbox/").content.decode()
    for n in range(51):
        mail(folder, f"<m{n}@shop.test>", f"Message {n}")

    first = client.get("/outbox/").content.decode()
    second = client.get("/outbox/?page=2").content.decode()
    assert first.count('<tr data-mail="') == 50 and "page 1 of 2" in first
    assert second.count('<tr data-mail="') == 1 and ">Message 0<" in second  # the oldest


@pytest.mark.django_db
def test_the_run_pages_ledger_links_each_email_to_the_outbox(folder: MailFolder,
                                                              settings: Any) -> None:
    olivia = make_user("olivia", "operator")
    run = Run.objects.create(agent="travel", status=Run.Status.COMPENSATED)
    Effect.objects.create(run=run, step_id="s1", node="send_confirmation", provider="smtp",
                          kind="email", external_id="<sg-effect-1@shop.test>",
                          status="compensated", recorded_at=run.created_at)
    Effect.objects.create(run=run, step_id="s2", node="charge_card", provider="stripe",
                          kind="charge", external_id="pi_1", amount=4200, currency="usd",
                          recorded_at=run.created_at)

    html = client_of(olivia).get(f"/runs/{run.code}/").content.decode()
    assert (f'<a href="/outbox/{digest_of("<sg-effect-1@shop.test>")}/" data-mail-link>'
            in html)
    assert html.count("data-mail-link") == 1  # the charge is no e-mail
    settings.STATEGUARD_MAIL_DIR = None
    assert "data-mail-link" not in client_of(olivia).get(f"/runs/{run.code}/").content.decode()
