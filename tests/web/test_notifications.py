"""Notifications (notifications/services.py): operators are told once per event that a run waits
for an approval or needs attention, by e-mail (``django.core.mail.outbox``) and a webhook (a
local HTTP server started here), never twice for a duplicate delivery or a redo, retried with
backoff when a channel fails, and never by the worker running the saga: a real worker goes on
with the next run while the webhook hangs."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import stripe
from django.core import mail
from django.utils import timezone

from stateguard.records import RunStatus
from stateguard_web.notifications import services as notifications
from stateguard_web.notifications import tasks as notification_tasks
from stateguard_web.runs import queue, runtime, services, tasks
from stateguard_web.sagas.models import Notification, Run
from tests.web.api.world import make_user
from tests.web.conftest import Workers, wait_for


@dataclass
class Hook:
    """A webhook receiver: records each request; answers with ``answers`` in turn (a status,
    or ``("sleep", seconds)``), then 204."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append({"headers": self.headers, "body": body,
                                   "at": time.time()})
            answer = state.answers.pop(0) if state.answers else 204
            if isinstance(answer, tuple):
                time.sleep(answer[1])
                answer = 204
            self.send_response(answer)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/stateguard"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture
def queued() -> Iterator[list[tuple[str, ...]]]:
    """The notification tasks queued (their arguments), to run here as a worker would."""
    calls: list[tuple[str, ...]] = []
    send = queue.send_on_commit

    def sent(task: Any, *args: Any, **kwargs: Any) -> None:
        if task is notification_tasks.notification_send:
            calls.append(args)
        else:
            send(task, *args, **kwargs)

    with mock.patch.object(queue, "send_on_commit", side_effect=sent):
        yield calls


def deliver(calls: list[tuple[str, ...]]) -> None:
    for args in calls:
        notification_tasks.notification_send(*args)


@pytest.fixture
def notify(settings: Any, hook: Hook) -> Hook:
    settings.STATEGUARD_NOTIFY_EMAIL = ["operators", "oncall@example.com"]
    settings.STATEGUARD_NOTIFY_WEBHOOK_URL = hook.url
    settings.STATEGUARD_NOTIFY_WEBHOOK_SECRET = "s3cret"
    settings.STATEGUARD_NOTIFY_WEBHOOK_TIMEOUT = 1.0
    settings.STATEGUARD_SITE_URL = "https://stateguard.example.com"
    make_user("charlie", "operator", email="charlie@example.com")
    make_user("dora", "operator")  # no address: not e-mailed
    make_user("vera", "viewer", email="vera@example.com")  # not an operator
    return hook


def paused_checkout(settings: Any, localstripe_url: str) -> Run:
    """A checkout over 100.00, executed here as a worker would: it waits for its approval."""
    settings.STRIPE_API_KEY, settings.STRIPE_API_BASE = "sk_test_stateguard", localstripe_url
    run = services.run_submit(agent="checkout", input={"email": "a@b.co", "amount": 250_00})
    tasks.run_execute(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED
    return run


@pytest.mark.django_db(transaction=True)
def test_it_tells_the_operators_once_that_a_run_waits_for_approval(
        settings: Any, notify: Hook, queued: list[tuple[str, ...]],
        stripe_client: stripe.StripeClient, localstripe_url: str) -> None:
    run = paused_checkout(settings, localstripe_url)
    approval = run.approvals.get()
    assert queued == [(str(run.code), "awaiting_approval", f"approval:{approval.step_id}")]

    deliver(queued)
    deliver(queued)  # a duplicate delivery
    runtime.journal().run_set_status(str(run.code), RunStatus.PAUSED)  # a redo writes it again
    assert len(queued) == 2 and queued[0] == queued[1]
    deliver(queued[1:])

    (message,) = mail.outbox
    assert message.to == ["oncall@example.com", "charlie@example.com"]
    assert message.subject == (f"[StateGuard] checkout run {str(run.code)[:8]} waits for "
                               "approval of charge_user")
    url = notifications.run_url(run)  # the dashboard's page, or the API's detail without it
    assert url.startswith("https://stateguard.example.com/") and str(run.code) in url
    assert url in message.body
    assert "'amount': 25000" in message.body  # what the gate saw
    (request,) = notify.received
    body = json.loads(request["body"])
    assert (body["id"], body["event"]) == (f"{run.code}:approval:{approval.step_id}",
                                           "run.awaiting_approval")
    assert body["run"]["code"] == str(run.code) and body["run"]["status"] == "paused"
    assert body["approval"]["id"] == approval.pk and body["approval"]["node"] == "charge_user"
    assert request["headers"]["X-StateGuard-Event"] == body["id"]
    signature = hmac.new(b"s3cret", request["body"], hashlib.sha256).hexdigest()
    assert request["headers"]["X-StateGuard-Signature"] == f"sha256={signature}"
    notification = Notification.objects.get()
    assert (notification.status, notification.attempts) == ("sent", 1)
    assert notification.email_sent_at and notification.webhook_sent_at


@pytest.mark.django_db(transaction=True)
def test_it_tells_each_time_a_run_needs_attention_again_but_not_for_a_redo(
        notify: Hook, queued: list[tuple[str, ...]]) -> None:
    run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATING,
                             error={"type": "CardError", "message": "declined", "traceback": ""})
    journal = runtime.journal()
    journal.run_set_status(str(run.code), RunStatus.NEEDS_ATTENTION)  # the unwind's end
    journal.run_set_status(str(run.code), RunStatus.NEEDS_ATTENTION)  # a redo of it
    deliver(queued)
    services.run_compensate(run=run, by="charlie")  # the operator retries the compensations
    request_id = Run.objects.get(pk=run.pk).request["id"]
    journal.run_set_status(str(run.code), RunStatus.NEEDS_ATTENTION)  # and they fail again
    deliver(queued)

    assert [key for _, _, key in queued] == ["needs_attention:auto"] * 2 + [
        f"needs_attention:{request_id}"]
    assert len(mail.outbox) == 2 and len(notify.received) == 2
    assert "needs attention" in mail.outbox[0].subject
    assert "CardError: declined" in mail.outbox[0].body
    assert sorted(Notification.objects.values_list("key", "status")) == sorted([
        ("needs_attention:auto", "sent"), (f"needs_attention:{request_id}", "sent")])


@pytest.mark.django_db(transaction=True)
def test_it_sends_nothing_for_a_run_that_no_longer_waits(
        notify: Hook, queued: list[tuple[str, ...]]) -> None:
    run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATING)
    runtime.journal().run_set_status(str(run.code), RunStatus.NEEDS_ATTENTION)
    services.run_resolve_by_hand(run=run, by="charlie", note="refunded in the Stripe dashboard")
    deliver(queued)
    assert mail.outbox == [] and notify.received == []
    assert Notification.objects.get().status == "skipped"


@pytest.mark.django_db(transaction=True)
def test_it_retries_the_channel_that_failed_alone_and_gives_up_in_the_end(
        settings: Any, notify: Hook, queued: list[tuple[str, ...]]) -> None:
    settings.STATEGUARD_NOTIFY_RETRIES = 2
    notify.answers = [500, ("sleep", 3), 503, 500]  # the third answer: never reached
    run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATING)
    runtime.journal().run_set_status(str(run.code), RunStatus.NEEDS_ATTENTION)
    (args,) = queued

    with mock.patch.object(notification_tasks.notification_send, "retry",
                           side_effect=RuntimeError("retry")) as retry:
        for attempt in range(2):  # what the worker does with each retry
            with pytest.raises(RuntimeError, match="retry"):
                notification_tasks.notification_send.apply(args, retries=attempt, throw=True)
            assert retry.call_args.kwargs["countdown"] == notifications.backoff(attempt)
        # The last attempt: it gives up.
        notification_tasks.notification_send.apply(args, retries=2, throw=True)
    assert [notifications.backoff(n) for n in range(2)] == [2, 4]

    notification = Notification.objects.get()
    assert (notification.status, notification.attempts) == ("failed", 3)
    assert notification.error.startswith("webhook: HTTPError: HTTP Error 503")
    assert len(mail.outbox) == 1  # e-mailed at the first attempt, never again
    assert len(notify.received) == 3  # the one that hung timed out after 1 s


@pytest.mark.django_db(transaction=True)
def test_it_tells_of_a_run_parked_for_an_agent_no_longer_offered(
        notify: Hook, queued: list[tuple[str, ...]]) -> None:
    run = Run.objects.create(agent="retired", input={})
    tasks.run_execute(run.pk)  # as a worker would: the run cannot go on, a person must look
    deliver(queued)
    assert Run.objects.get(pk=run.pk).status == Run.Status.NEEDS_ATTENTION
    assert queued == [(str(run.code), "needs_attention", "needs_attention:auto")]
    (message,) = mail.outbox
    assert "UnknownAgent: agent 'retired' is not offered" in message.body


@pytest.mark.django_db(transaction=True)
def test_it_queues_nothing_when_no_channel_is_configured(
        queued: list[tuple[str, ...]]) -> None:
    run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATING)
    runtime.journal().run_set_status(str(run.code), RunStatus.NEEDS_ATTENTION)
    assert queued == [] and not Notification.objects.exists()


def test_a_slow_webhook_never_holds_up_the_worker(
        workers: Workers, sandbox: Path, hook: Hook, stripe_client: stripe.StripeClient,
        localstripe_url: str) -> None:
    """One worker process: the first run pauses, its notification's webhook hangs for 60 s;
    the second run, submitted then, still pauses within seconds (the webhook's timeout is
    1 s, and its retry waits in the queue, not in the worker)."""
    hook.answers = [("sleep", 60)] * 10
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY="sk_test_stateguard",
                       STATEGUARD_NOTIFY_WEBHOOK_URL=hook.url,
                       STATEGUARD_NOTIFY_WEBHOOK_TIMEOUT="1", STATEGUARD_NOTIFY_RETRIES="3")
    workers.start("w1")
    first = services.run_submit(agent="checkout", input={"email": "a@b.co", "amount": 250_00})
    wait_for(lambda: Run.objects.filter(pk=first.pk, status="paused").exists(), 60,
             "the first run to pause", workers.logs)
    wait_for(lambda: hook.received, 30, "the webhook to be called", workers.logs)

    started = time.monotonic()
    second = services.run_submit(agent="checkout", input={"email": "b@c.co", "amount": 300_00})
    wait_for(lambda: Run.objects.filter(pk=second.pk, status="paused").exists(), 30,
             "the second run to pause", workers.logs)
    assert time.monotonic() - started < 10  # not the webhook's 60 s
    paused_at = Run.objects.get(pk=first.pk).updated_at.timestamp()
    assert paused_at < hook.received[0]["at"]  # the run went on before the webhook was called
    wait_for(lambda: Notification.objects.filter(run=first, attempts__gte=1).exclude(
        error="").exists(), 30, "the first attempt to time out", workers.logs)
    notification = Notification.objects.get(run=first)
    assert notification.status == "pending" and "timed out" in notification.error
    assert timezone.now() - notification.created_at < timezone.timedelta(seconds=60)
