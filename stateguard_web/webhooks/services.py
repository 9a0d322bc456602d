"""Webhooks' writes: secrets, submissions with a URL, and sending the outbox.

Sending: ``deliveries_claim`` (beat's sweep) moves each due delivery's ``next_attempt_at`` past
the longest a send can take (its claim) and hands its id and claim to a task;
``delivery_send`` sends it only if the claim is still the one it was given (a task queued
twice, or late, sends nothing), under the row's lock. A sender that dies leaves the claim to
expire: the sweep hands the delivery out again. A receiver may so get an event twice (an
answer lost after it was received): the event id lets it see that.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from stateguard_web.accounts.models import ApiKey
from stateguard_web.runs import services as runs
from stateguard_web.runs.services import By, SubmissionError
from stateguard_web.sagas.models import AuditEvent, Run
from stateguard_web.webhooks import signing
from stateguard_web.webhooks.addresses import UrlRefused, url_check
from stateguard_web.webhooks.models import Attempt, Delivery, RunWebhook

USER_AGENT = "StateGuard-Webhooks/1"
SNIPPET = 500  # characters of a response body (and of an error) kept per attempt
BATCH = 100  # deliveries claimed per sweep


class WebhookRefused(SubmissionError):
    """A submission's webhook cannot be accepted (the message says why: a 422)."""


@transaction.atomic
def key_secret_rotate(*, key: ApiKey, by: AbstractBaseUser | None = None) -> str:
    """Give ``key`` a new webhook secret (its first, or one replacing the old at once) and
    return it: the only time it is shown."""
    first = not key.webhook_secret
    key.webhook_secret = signing.secret_new()
    key.save(update_fields=["webhook_secret"])  # its signal refreshes every key cache
    actor = str(by.get_username()) if by is not None else "system"
    AuditEvent.objects.create(actor=actor, action="webhook.secret_rotated",
                              data={"prefix": key.prefix, "first": first})
    return key.webhook_secret


def key_default_set(*, key: ApiKey, url: str) -> ApiKey:
    """Where the key's submissions' events go when they name no URL (empty: nowhere)."""
    if not key.webhook_secret:
        raise UrlRefused("this API key has no webhook secret yet: POST /api/webhooks/secret")
    if url:
        url_check(url)
    key.webhook_url = url
    key.save(update_fields=["webhook_url"])
    return key


def run_submit(*, agent: str, input: dict[str, Any] | str, by: By = None,
               idempotency_key: str = "", key: ApiKey | None = None,
               webhook_url: str | None = None) -> Run:
    """``runs.services.run_submit``, and the run's webhook (the URL named, else the key's
    default) stored with the run, before any worker can change its status. A URL that may
    not receive webhooks, or one named without an API key with a secret, is refused
    (``WebhookRefused``) and nothing is stored."""
    url = webhook_url or (key.webhook_url if key is not None else "")
    if not url:  # most submissions: nothing more than the run's own
        return runs.run_submit(agent=agent, input=input, by=by, idempotency_key=idempotency_key)
    if key is None or not key.webhook_secret:
        raise WebhookRefused(
            "webhook_url: webhooks are signed with the API key's webhook secret: submit with "
            "an API key that has one (POST /api/webhooks/secret)")
    try:
        url_check(url)  # before the transaction: it may wait for DNS
    except UrlRefused as exc:
        raise WebhookRefused(f"webhook_url: {exc}") from None
    with transaction.atomic():
        run = runs.run_submit(agent=agent, input=input, by=by, idempotency_key=idempotency_key)
        if not run.replayed:
            RunWebhook.objects.create(run=run, url=url, key=key)
    return run


def backoff(attempts: int) -> timedelta:
    """The wait after the ``attempts``-th failure: 30 s, 1, 2, 4 min..., at most an hour."""
    return timedelta(seconds=min(30 * 2 ** (attempts - 1), 3600))


def _claim_length() -> timedelta:
    return timedelta(seconds=2 * settings.STATEGUARD_WEBHOOKS_TIMEOUT + 60)


def deliveries_claim(*, limit: int = BATCH) -> list[tuple[int, str]]:
    """Claim the deliveries that are due: (id, claim) for each, for ``delivery_send``."""
    now = timezone.now()
    until = now + _claim_length()
    with transaction.atomic():
        ids = list(Delivery.objects.select_for_update(skip_locked=True)
                   .filter(status=Delivery.Status.PENDING, next_attempt_at__lte=now)
                   .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
        Delivery.objects.filter(pk__in=ids).update(next_attempt_at=until)
    return [(pk, until.isoformat()) for pk in ids]


def body(delivery: Delivery) -> bytes:
    """The event as the receiver gets it (the same bytes at every attempt)."""
    data = dict(delivery.data)
    data["code"] = str(uuid.UUID(str(data.get("code"))))  # SQLite's trigger stores it as hex
    if isinstance(data.get("error"), str):  # SQLite: JSON as text
        data["error"] = json.loads(data["error"])
    event = {"id": delivery.event_id, "type": delivery.type,
             "created": int(delivery.created_at.timestamp()), "data": data}
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()


def _post(url: str, address: str, content: bytes,
          headers: dict[str, str]) -> tuple[int, str]:
    """POST to ``address``, the one ``url_check`` just allowed, not to a second lookup of the
    name (which could answer otherwise); TLS still checks the certificate against the name.
    The status and the start of the answer: no more of it is read, and no longer than the
    timeout (a receiver that drips its answer is cut off)."""
    target = httpx.URL(url)
    headers = {**headers, "Host": target.netloc.decode("ascii")}
    timeout = settings.STATEGUARD_WEBHOOKS_TIMEOUT
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client, \
            client.stream("POST", target.copy_with(host=address), content=content,
                          headers=headers, extensions={"sni_hostname": target.host}) as response:
        start = b""
        for chunk in response.iter_bytes():
            start += chunk
            if len(start) >= 4 * SNIPPET or time.monotonic() > deadline:
                break
        return response.status_code, start.decode("utf-8", "replace")[:SNIPPET]


def delivery_send(*, delivery_id: int, claim: str | None = None) -> Attempt | None:
    """One attempt to send the delivery, stored; None if it is not for this sender (done, or
    claimed again since ``claim``, or being sent by another)."""
    with transaction.atomic():
        delivery = (Delivery.objects.select_for_update(skip_locked=True)
                    .filter(pk=delivery_id, status=Delivery.Status.PENDING).first())
        if delivery is None or (claim is not None and delivery.next_attempt_at
                                != datetime.fromisoformat(claim)):
            return None
        hook = RunWebhook.objects.select_related("key").get(run_id=delivery.run_id)
        content = body(delivery)
        number = delivery.attempts + 1
        started, clock = timezone.now(), time.monotonic()
        code, snippet, error = None, "", ""
        try:
            address = url_check(hook.url)[0]  # again: DNS may answer otherwise now
            code, snippet = _post(hook.url, address, content, {
                "Content-Type": "application/json", "User-Agent": USER_AGENT,
                "StateGuard-Event-Id": delivery.event_id,
                signing.HEADER: signing.sign(hook.key.webhook_secret, content)})
        except UrlRefused as exc:
            error = f"refused: {exc}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        attempt = Attempt.objects.create(
            delivery=delivery, number=number, url=hook.url, started_at=started,
            duration_ms=int((time.monotonic() - clock) * 1000), status_code=code,
            response=snippet, error=error[:SNIPPET])
        now = timezone.now()
        delivery.attempts = number
        if attempt.ok:
            delivery.status, delivery.delivered_at, delivery.next_attempt_at = (
                Delivery.Status.DELIVERED, now, None)
        else:
            retry_at = now + backoff(number)
            deadline = delivery.created_at + timedelta(
                hours=settings.STATEGUARD_WEBHOOKS_RETRY_HOURS)
            if retry_at > deadline:
                delivery.status, delivery.next_attempt_at = Delivery.Status.FAILED, None
            else:
                delivery.next_attempt_at = retry_at
        delivery.save(update_fields=["attempts", "status", "delivered_at", "next_attempt_at"])
    return attempt
