"""Personas and runs for the API tests.

alice and bob are submitters (alice submitted every run here), vera a viewer, charlie an
operator, root a superuser who logs in (a session, with the CSRF token); each of the others
has an API key, and charlie also has a revoked and an expired one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client, TestCase
from django.utils import timezone
from django.utils.crypto import get_random_string

from stateguard_web.accounts import services as accounts
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step

CSRF_SECRET = get_random_string(32)
PROVISION = {"agent": "provision", "input": {"name": "web-1"}}


def journal_state() -> tuple[Any, ...]:
    """Everything an API call could change in the journal (refusals must change none of it)."""
    return (list(Run.objects.order_by("pk").values_list("pk", "status", "request")),
            list(Approval.objects.order_by("pk").values_list("pk", "status", "decided_by")),
            list(Compensation.objects.order_by("pk").values_list("pk", "status")),
            AuditEvent.objects.count())


def make_user(username: str, role: str | None = None, **extra: Any) -> Any:
    user = get_user_model().objects.create_user(username, **extra)
    if role:
        accounts.role_grant(user=user, role=role)
    return user


class World(TestCase):
    keys: dict[str, str]

    @classmethod
    def setUpTestData(cls) -> None:
        cls.alice = make_user("alice", "submitter")
        cls.bob = make_user("bob", "submitter")
        cls.vera = make_user("vera", "viewer")
        cls.charlie = make_user("charlie", "operator")
        cls.root = get_user_model().objects.create_superuser("root", password="x")
        cls.keys = {name: accounts.api_key_create(user=user, name=name)[1]
                    for name, user in [("alice", cls.alice), ("bob", cls.bob),
                                       ("vera", cls.vera), ("charlie", cls.charlie)]}
        revoked, cls.keys["revoked"] = accounts.api_key_create(user=cls.charlie, name="old")
        accounts.api_key_revoke(key=revoked)
        _, cls.keys["expired"] = accounts.api_key_create(
            user=cls.charlie, name="temp", expires_at=timezone.now() - timedelta(seconds=1))
        now = timezone.now()
        cls.paused = Run.objects.create(agent="checkout", status=Run.Status.PAUSED,
                                        submitted_by=cls.alice,
                                        input={"email": "a@b.co", "amount": 25000})
        cls.approval = Approval.objects.create(run=cls.paused, step_id="t-charge",
                                               node="charge_user", requested_at=now,
                                               payload={"amount": 25000})
        cls.failed = Run.objects.create(agent="provision", status=Run.Status.FAILED,
                                        submitted_by=cls.alice, input={"name": "web-2"})
        cls.stuck = Run.objects.create(agent="checkout", status=Run.Status.NEEDS_ATTENTION,
                                       submitted_by=cls.alice,
                                       input={"email": "c@d.co", "amount": 500})
        step = Step.objects.create(run=cls.stuck, step_id="t-charge-2", node="charge_user",
                                   status=Step.Status.SUCCEEDED, started_at=now,
                                   finished_at=now, done_seq=1, update={"charge": "ch_1"})
        cls.compensation = Compensation.objects.create(
            run=cls.stuck, step=step, node="charge_user", idempotency_key="k-1",
            status=Compensation.Status.FAILED)
        cls.compensation.attempts.create(
            number=1, started_at=now, finished_at=now, ok=False,
            error={"type": "APIConnectionError", "message": "refund API down",
                   "traceback": ""})

    def as_(self, who: str) -> tuple[Client, dict[str, str]]:
        """A client and the headers that make a request come from ``who``: a persona's key,
        ``revoked``/``expired`` (charlie's dead keys), ``root`` (a session with the CSRF
        token) or ``anonymous``."""
        client = Client(enforce_csrf_checks=True)
        if who == "anonymous":
            return client, {}
        if who == "root":
            client.force_login(self.root)
            client.cookies["csrftoken"] = CSRF_SECRET
            return client, {"HTTP_X_CSRFTOKEN": CSRF_SECRET}
        return client, {"HTTP_AUTHORIZATION": f"Bearer {self.keys[who]}"}

    def call(self, who: str, method: str, path: str, body: Any = None,
             **headers: str) -> Any:
        client, auth = self.as_(who)
        if method == "GET":
            return client.get(path, **auth, **headers)
        return client.generic(method, path, "" if body is None else _json(body),
                              content_type="application/json", **auth, **headers)


def _json(body: Any) -> str:
    import json

    return body if isinstance(body, str) else json.dumps(body)
