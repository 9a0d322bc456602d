"""Operators told when a run waits for them: for an approval, or because it needs attention.

``receivers.run_status_changed`` hears where a worker writes a status on which a run waits for
an operator (the journal's ``signals.run_waits``: ``paused`` and ``needs_attention``, also for a
run of an agent no longer offered): only when a channel is configured, it queues
``tasks.notification_send`` once the write commits. The worker pays one small query and a
message to the broker per such status, never the sending: e-mail and webhook go out from a
task of their own, with a timeout, retried with backoff.

Once per event: each occurrence has a key (``approval:<step id>`` for the gate's approval,
``needs_attention:<id of the operator's request whose unwind ended there>`` or ``...:auto``)
and one ``Notification`` row per run and key (a unique constraint). A duplicate delivery, or a
worker writing the same status again after a crash, finds the row sent and sends nothing; two
deliveries at once take turns on its row lock. A channel that worked is not sent again when
the other one is retried. A webhook may still get an event twice (an answer lost after it was
received): ``X-StateGuard-Event`` carries the event's id for the receiver to deduplicate.

Settings (docs/deploy.md, "Notifications"): ``STATEGUARD_NOTIFY_EMAIL`` (addresses, and/or
``operators`` for every operator with an e-mail address), ``STATEGUARD_NOTIFY_WEBHOOK_URL``
(+ ``_SECRET`` to sign the body, ``_TIMEOUT``), ``STATEGUARD_NOTIFY_RETRIES``,
``STATEGUARD_SITE_URL`` for links, and Django's e-mail settings (``EMAIL_URL``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.request
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Approval, Notification, Run

logger = logging.getLogger("stateguard.notifications")

EVENTS = {Run.Status.PAUSED.value: Notification.Event.AWAITING_APPROVAL,
          Run.Status.NEEDS_ATTENTION.value: Notification.Event.NEEDS_ATTENTION}
OPERATORS = "operators"  # in STATEGUARD_NOTIFY_EMAIL: every operator's address


class DeliveryFailed(Exception):
    """A channel failed; the task retries it later (the other channel is not sent again)."""


def enabled() -> bool:
    return bool(settings.STATEGUARD_NOTIFY_EMAIL or settings.STATEGUARD_NOTIFY_WEBHOOK_URL)


def backoff(retries: int) -> int:
    """Seconds before the next attempt: 2, 4, 8, ... up to 5 minutes."""
    return int(min(2 ** (retries + 1), 300))


def notification_send(*, run_code: str, event: str, key: str,
                      final: bool = False) -> Notification | None:
    """Tell the operators, on every channel not done yet for this event, unless the run no
    longer waits. Raises ``DeliveryFailed`` for the task to retry, unless ``final`` (the last
    attempt): then the row is marked failed."""
    run = Run.objects.filter(code=run_code).first()
    if run is None:
        return None
    row, _ = Notification.objects.get_or_create(run=run, key=key, defaults={"event": event})
    errors: list[str] = []
    with transaction.atomic():
        # One sender at a time: a duplicate delivery waits here, then finds it sent.
        notification = Notification.objects.select_for_update().get(pk=row.pk)
        if notification.status != Notification.Status.PENDING:
            return notification
        if not _still_waits(run, notification):
            notification.status = Notification.Status.SKIPPED
            notification.save(update_fields=["status", "updated_at"])
            return notification
        notification.attempts += 1
        message = _message(run, notification)
        if settings.STATEGUARD_NOTIFY_EMAIL and notification.email_sent_at is None:
            try:
                _email(message)
                notification.email_sent_at = timezone.now()
            except Exception as exc:
                errors.append(f"e-mail: {type(exc).__name__}: {exc}")
        if settings.STATEGUARD_NOTIFY_WEBHOOK_URL and notification.webhook_sent_at is None:
            try:
                _webhook(message["payload"])
                notification.webhook_sent_at = timezone.now()
            except Exception as exc:
                errors.append(f"webhook: {type(exc).__name__}: {exc}")
        notification.error = "; ".join(errors)[:2000]
        if not errors:
            notification.status = Notification.Status.SENT
        elif final:
            notification.status = Notification.Status.FAILED
            logger.error("gave up notifying %s of run %s after %d attempts: %s", key, run_code,
                         notification.attempts, notification.error)
        notification.save()
    if errors and not final:
        raise DeliveryFailed(notification.error)
    return notification


def _still_waits(run: Run, notification: Notification) -> bool:
    run.refresh_from_db(fields=["status"])
    if notification.event == Notification.Event.AWAITING_APPROVAL:
        step_id = notification.key.removeprefix("approval:")
        return run.approvals.filter(step_id=step_id, status=Approval.Status.PENDING).exists()
    return run.status == Run.Status.NEEDS_ATTENTION


def run_url(run: Run) -> str:
    """The run's page on the dashboard (its API detail where there is no dashboard)."""
    try:
        path = reverse("dashboard:run", kwargs={"code": run.code})
    except NoReverseMatch:
        path = f"/api/runs/{run.code}"
    return settings.STATEGUARD_SITE_URL.rstrip("/") + path


def _message(run: Run, notification: Notification) -> dict[str, Any]:
    approval = None
    if notification.event == Notification.Event.AWAITING_APPROVAL:
        step_id = notification.key.removeprefix("approval:")
        found = run.approvals.filter(step_id=step_id).first()
        if found is not None:
            approval = {"id": found.pk, "node": found.node, "step_id": found.step_id,
                        "payload": found.payload,
                        "requested_at": found.requested_at.isoformat()}
    failed = list(run.compensations.filter(status__in=["failed", "skipped_in_doubt"])
                  .values_list("node", "status"))
    url = run_url(run)
    summary = selectors.run_summary(run=run)
    payload = {"id": f"{run.code}:{notification.key}", "event": f"run.{notification.event}",
               "run": summary, "approval": approval,
               "failed_compensations": [{"node": n, "status": s} for n, s in failed],
               "url": url, "at": timezone.now().isoformat()}
    context = {"run": run, "event": notification.event, "approval": approval, "url": url,
               "failed": failed, "error": run.error or {}}
    return {"payload": payload, "context": context}


def _recipients() -> list[str]:
    wanted = list(settings.STATEGUARD_NOTIFY_EMAIL)
    addresses = [a for a in wanted if a != OPERATORS]
    if OPERATORS in wanted:
        operate = Permission.objects.filter(codename="operate_run",
                                            content_type__app_label="sagas")
        operators = get_user_model().objects.filter(
            Q(is_superuser=True) | Q(user_permissions__in=operate)
            | Q(groups__permissions__in=operate), is_active=True).exclude(email="")
        addresses += sorted(set(operators.values_list("email", flat=True)))
    return list(dict.fromkeys(addresses))


def _email(message: dict[str, Any]) -> None:
    to = _recipients()
    if not to:
        logger.warning("no e-mail address to notify (STATEGUARD_NOTIFY_EMAIL: no operator has "
                       "an e-mail address)")
        return
    context = message["context"]
    subject = " ".join(render_to_string("emails/notification-subject.txt", context).split())
    body = render_to_string("emails/notification-body.txt", context)
    EmailMessage(subject, body, to=to).send()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook answers itself: a redirect is a wrong URL (and would turn the POST into a
    GET), so it is a failure, shown in the row's error."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def _webhook(payload: dict[str, Any]) -> None:
    """POST the event as JSON, with a short timeout; anything but a 2xx answer is a failure."""
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "StateGuard",
               "X-StateGuard-Event": payload["id"]}
    secret = settings.STATEGUARD_NOTIFY_WEBHOOK_SECRET
    if secret:
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        headers["X-StateGuard-Signature"] = f"sha256={digest}"
    request = urllib.request.Request(settings.STATEGUARD_NOTIFY_WEBHOOK_URL, data=body,
                                     headers=headers, method="POST")
    with _opener.open(request, timeout=settings.STATEGUARD_NOTIFY_WEBHOOK_TIMEOUT) as answer:
        if not 200 <= answer.status < 300:
            raise DeliveryFailed(f"the webhook answered {answer.status}")
