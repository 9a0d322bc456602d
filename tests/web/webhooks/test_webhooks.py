"""Webhooks for submitters (stateguard_web/webhooks/): a run submitted with a URL gets a signed
POST per event, from an outbox row the status change itself writes, retried with backoff,
every attempt visible through the API; URLs to private addresses are refused."""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from stateguard.records import ErrorInfo, RunStatus
from stateguard_web.accounts.models import ApiKey
from stateguard_web.sagas.journal.django_journal import DjangoJournal
from stateguard_web.sagas.models import AuditEvent, Run
from stateguard_web.webhooks import signing, tasks
from stateguard_web.webhooks.addresses import UrlRefused, url_check
from stateguard_web.webhooks.models import Delivery, RunWebhook
from tests.web.api.world import PROVISION, World
from tests.web.webhooks.receiver import Receiver, receiver


def sweep() -> int:
    """Beat's task, with each send it hands out run here, as a worker would."""
    with mock.patch.object(tasks.webhook_send, "delay",
                           side_effect=lambda *args: tasks.webhook_send(*args)):
        return int(tasks.webhooks_sweep())


class WebhookWorld(World):
    def secret(self, who: str = "alice") -> str:
        response = self.call(who, "POST", "/api/webhooks/secret")
        assert response.status_code == 200, response.content
        return str(response.json()["secret"])

    def submit(self, url: str | None, who: str = "alice") -> Run:
        response = self.call(who, "POST", "/api/runs", {**PROVISION, "webhook_url": url})
        assert response.status_code == 201, response.content
        return Run.objects.get(code=response.json()["code"])

    def finish(self, run: Run, status: RunStatus = RunStatus.SUCCEEDED) -> None:
        """What a worker does: its journal's hand-made status write."""
        Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
        DjangoJournal().run_set_status(str(run.code), status, ErrorInfo("E", "boom", "")
                                       if status == RunStatus.FAILED else None)

    def sent_once(self, answer: int | float) -> tuple[Run, Receiver]:
        """A run with a webhook, succeeded, its event sent once to a receiver that answered
        ``answer``."""
        self.secret()
        with receiver() as hook:
            hook.answers = [answer]
            run = self.submit(hook.url)
            self.finish(run)
            sweep()
        return run, hook


class DeliveryTests(WebhookWorld):
    def test_it_posts_a_signed_event_that_the_receiver_verifies(self) -> None:
        secret = self.secret()
        assert secret.startswith("whsec_")
        with receiver() as hook:
            run = self.submit(hook.url)
            self.finish(run)
            assert sweep() == 1
        (request,) = hook.received
        body = request["body"]
        signing.verify(secret, body, request["headers"][signing.HEADER])  # raises if wrong
        event = json.loads(body)
        assert event["type"] == "run.succeeded" and event["id"].startswith("evt_")
        assert request["headers"]["StateGuard-Event-Id"] == event["id"]
        assert event["data"]["code"] == str(run.code)
        assert (event["data"]["agent"], event["data"]["status"]) == ("provision", "succeeded")
        with pytest.raises(signing.SignatureInvalid):  # another key's secret does not verify
            signing.verify(self.secret("bob"), body, request["headers"][signing.HEADER])
        with pytest.raises(signing.SignatureInvalid):  # nor a body changed on the way
            signing.verify(secret, body.replace(b"succeeded", b"failed"),
                           request["headers"][signing.HEADER])
        with pytest.raises(signing.SignatureInvalid):  # nor the same message an hour later
            signing.verify(secret, body, request["headers"][signing.HEADER],
                           now=event["created"] + 3600)
        assert sweep() == 0  # delivered: not sent again

    def test_it_retries_after_a_500_with_backoff_then_gives_up_after_a_day(self) -> None:
        self.secret()
        with receiver() as hook:
            hook.answers = [500]
            run = self.submit(hook.url)
            self.finish(run, RunStatus.FAILED)
            assert sweep() == 1
            assert sweep() == 0  # backing off: 30 s
            with time_machine.travel(timezone.now() + timedelta(seconds=31), tick=True):
                assert sweep() == 1
        first, second = (json.loads(r["body"]) for r in hook.received)
        assert first["id"] == second["id"]  # the same event: the receiver sees a replay
        assert first["type"] == "run.failed" and first["data"]["error"]["message"] == "boom"

        response = self.call("alice", "GET", f"/api/runs/{run.code}/webhooks")
        assert response.status_code == 200
        (delivery,) = response.json()["deliveries"]
        assert (delivery["status"], delivery["attempts"]) == ("delivered", 2)
        assert [(t["status_code"], t["ok"]) for t in delivery["tries"]] == [
            (500, False), (204, True)]
        assert delivery["tries"][0]["response"] == "answer 500"
        assert self.call("bob", "GET", f"/api/runs/{run.code}/webhooks").status_code == 404

        # A receiver that never answers well: after a day of tries, failed.
        with receiver() as hook:
            hook.answers = [500] * 5
            run = self.submit(hook.url)
            self.finish(run)
            assert sweep() == 1
            with time_machine.travel(timezone.now() + timedelta(hours=25), tick=True):
                assert sweep() == 1
                assert sweep() == 0
        delivery = Delivery.objects.get(run=run)
        assert (delivery.status, delivery.attempts) == (Delivery.Status.FAILED, 2)

    def test_it_records_a_receiver_that_is_down(self) -> None:
        self.secret()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))  # a port nobody listens on
            port = sock.getsockname()[1]
        run = self.submit(f"http://127.0.0.1:{port}/hooks")
        self.finish(run, RunStatus.NEEDS_ATTENTION)
        assert sweep() == 1
        delivery = Delivery.objects.get(run=run)
        (attempt,) = delivery.tries.all()
        assert attempt.status_code is None and "ConnectError" in attempt.error
        assert delivery.status == Delivery.Status.PENDING and delivery.next_attempt_at


    @override_settings(STATEGUARD_WEBHOOKS_TIMEOUT=0.2)
    def test_it_gives_up_on_a_receiver_slower_than_the_timeout(self) -> None:
        run, _ = self.sent_once(0.6)
        (attempt,) = Delivery.objects.get(run=run).tries.all()
        assert attempt.status_code is None and attempt.error.startswith("ReadTimeout")
        assert attempt.duration_ms < 550


class OutboxTests(WebhookWorld):
    def test_it_writes_the_outbox_row_with_the_status_change_or_not_at_all(self) -> None:
        self.secret()
        run = self.submit("http://127.0.0.1:9/hooks")
        Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
        assert not Delivery.objects.exists()  # running makes no event

        with pytest.raises(RuntimeError), transaction.atomic():
            DjangoJournal().run_set_status(str(run.code), RunStatus.PAUSED)
            assert Delivery.objects.filter(run=run).count() == 1  # in the same transaction
            raise RuntimeError("the worker's transaction rolls back")
        assert not Delivery.objects.exists()

        DjangoJournal().run_set_status(str(run.code), RunStatus.PAUSED)
        DjangoJournal().run_set_status(str(run.code), RunStatus.PAUSED)  # a redo: no change
        assert list(Delivery.objects.values_list("type", flat=True)) == [
            "run.awaiting_approval"]
        run.refresh_from_db()
        run.status = Run.Status.COMPENSATED  # any writer: a service's save() too
        run.save()
        assert list(Delivery.objects.values_list("type", flat=True)) == [
            "run.awaiting_approval", "run.compensated"]
        assert len(set(Delivery.objects.values_list("event_id", flat=True))) == 2

    def test_it_writes_nothing_for_a_run_without_a_webhook(self) -> None:
        response = self.call("alice", "POST", "/api/runs", PROVISION)
        run = Run.objects.get(code=response.json()["code"])
        self.finish(run)
        assert not Delivery.objects.exists()
        assert self.call("alice", "GET", f"/api/runs/{run.code}/webhooks").json() == {
            "url": None, "deliveries": []}

    def test_it_uses_the_keys_default_url(self) -> None:
        self.secret()
        assert self.call("alice", "PUT", "/api/webhooks/default",
                         {"url": "http://127.0.0.1:9/default"}).status_code == 200
        run = self.submit(None)
        assert RunWebhook.objects.get(run=run).url == "http://127.0.0.1:9/default"
        assert self.submit("http://127.0.0.1:9/own").webhook.url == "http://127.0.0.1:9/own"

    def test_it_rotates_the_secret_and_audits_it(self) -> None:
        first, second = self.secret(), self.secret()
        assert first != second
        key = ApiKey.objects.get(user=self.alice)
        assert key.webhook_secret == second
        assert AuditEvent.objects.filter(action="webhook.secret_rotated").count() == 2
        response = self.call("root", "POST", "/api/webhooks/secret", {})  # a session: no key
        assert response.status_code == 403 and "API keys" in response.json()["detail"]


class RefusalTests(WebhookWorld):
    @override_settings(STATEGUARD_WEBHOOKS_ALLOW_PRIVATE=False)
    def test_it_refuses_private_loopback_and_link_local_addresses(self) -> None:
        for url in ["http://127.0.0.1/", "http://10.1.2.3:8080/x", "http://[::1]/",
                    "http://169.254.169.254/latest/meta-data", "http://localhost:8000/",
                    "http://0.0.0.0/", "http://[::ffff:127.0.0.1]/", "http://192.168.1.1/",
                    "http://100.64.0.1/", "http://224.0.0.1/"]:
            with pytest.raises(UrlRefused, match="private, loopback"):
                url_check(url)
        answers = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 80)),
                   (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80))]
        with mock.patch.object(socket, "getaddrinfo", return_value=answers), \
                pytest.raises(UrlRefused, match=r"resolves to 127\.0\.0\.1"):
            url_check("http://rebound.example/")  # one bad address among good ones
        assert url_check("https://93.184.215.14/hooks") == ["93.184.215.14"]

        self.secret()
        before = Run.objects.count()
        response = self.call("alice", "POST", "/api/runs",
                             {**PROVISION, "webhook_url": "http://127.0.0.1:9/hooks"})
        assert response.status_code == 422
        assert response.json()["errors"] == [{"loc": ["body", "webhook_url"], "msg": mock.ANY}]
        assert "loopback" in response.json()["detail"]
        assert Run.objects.count() == before  # nothing stored

    def test_it_refuses_bad_urls_and_webhooks_without_a_secret(self) -> None:
        response = self.call("alice", "POST", "/api/runs",
                             {**PROVISION, "webhook_url": "http://127.0.0.1:9/"})
        assert response.status_code == 422
        assert "webhook secret" in response.json()["detail"]
        self.secret()
        for url, says in [("ftp://example.com/", "http:// or https://"),
                          ("not a url", "http:// or https://"),
                          ("http://user:pw@127.0.0.1/", "user name"),
                          ("http://127.0.0.1:99999/", "not a valid URL"),
                          ("http://no-such-host.invalid/", "does not resolve"),
                          ("http://" + "a" * 2000 + ".com/", "at most 2000")]:
            response = self.call("alice", "POST", "/api/runs", {**PROVISION, "webhook_url": url})
            assert response.status_code == 422, (url, response.content)
            assert says in response.json()["detail"], (url, response.json())
        response = self.call("alice", "PUT", "/api/webhooks/default", {"url": "gopher://x/"})
        assert response.status_code == 422

    def test_it_checks_the_address_again_when_it_delivers(self) -> None:
        self.secret()
        with receiver() as hook:
            run = self.submit(hook.url)  # allowed then (tests allow private addresses)
            self.finish(run)
            with override_settings(STATEGUARD_WEBHOOKS_ALLOW_PRIVATE=False):
                assert sweep() == 1
        assert hook.received == []
        (attempt,) = Delivery.objects.get(run=run).tries.all()
        assert attempt.error.startswith("refused: ") and attempt.status_code is None

    def test_it_follows_no_redirect(self) -> None:
        run, hook = self.sent_once(302)
        assert len(hook.received) == 1
        delivery = Delivery.objects.get(run=run)
        assert delivery.status == Delivery.Status.PENDING  # a 302 is no delivery


class PageTests(WebhookWorld):
    def test_it_shows_deliveries_on_the_run_page(self) -> None:
        run, hook = self.sent_once(503)
        client, _ = self.as_("root")
        page = client.get(f"/runs/{run.code}/").content.decode()
        assert hook.url in page and "run.succeeded" in page
        assert "<strong>503</strong>" in page and "answer 503" in page
        plain = Run.objects.create(agent="provision", submitted_by=self.alice)
        assert "data-webhooks" not in client.get(f"/runs/{plain.code}/").content.decode()

    def test_it_rotates_a_secret_from_the_admin_and_shows_it_once(self) -> None:
        client, _ = self.as_("root")
        client.cookies.pop("csrftoken")
        client = type(client)()  # the admin with Django's usual CSRF handling in tests
        client.force_login(self.root)
        key = ApiKey.objects.get(user=self.alice)
        response = client.post("/admin/accounts/apikey/", {
            "action": "rotate_webhook_secret", "_selected_action": [key.pk]})
        assert response.status_code == 200
        key.refresh_from_db()
        assert key.webhook_secret in response.content.decode()


def test_the_docs_verification_snippet_agrees_with_the_signer() -> None:
    text = (Path(__file__).parents[3] / "docs" / "api.md").read_text()
    snippet = text.split("refuse an old\ntimestamp (a replayed message):\n\n```python\n", 1)[1]
    namespace: dict[str, Any] = {}
    exec(snippet.split("```", 1)[0], namespace)  # the receiver's code, as documented
    verify = namespace["verify"]
    body, secret = b'{"id":"evt_1"}', signing.secret_new()
    header = signing.sign(secret, body)
    assert verify(secret, body, header)
    assert not verify(secret, body + b" ", header)
    assert not verify("whsec_other", body, header)
    assert not verify(secret, body, signing.sign(secret, body, timestamp=1_000_000_000))
    assert not verify(secret, body, "v1=abc")
