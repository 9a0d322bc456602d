"""Personas and runs for the dashboard's tests.

alice and bob are submitters (alice submitted every run here), vera a viewer, charlie an
operator. The runs: one paused at checkout's charge (250.00 USD) with its approval pending, a
failed provision run, a provision run that needs attention (its undo of attach_address failed
after launch_instance's succeeded), and a succeeded checkout whose input holds a script tag.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import Client, TestCase
from django.utils import timezone

from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step
from tests.web.api.world import journal_state, make_user

__all__ = ["SCRIPT", "DashboardWorld", "journal_state"]

SCRIPT = "<script>alert('pwned')</script>"


def step(run: Run, node: str, seq: int | None, status: str = Step.Status.SUCCEEDED,
         **extra: Any) -> Step:
    at = run.created_at + timedelta(seconds=seq or 9)
    extra.setdefault("finished_at", at + timedelta(milliseconds=340))
    return Step.objects.create(run=run, step_id=f"{run.code}-{node}", node=node, status=status,
                               started_at=at, done_seq=seq, **extra)


class DashboardWorld(TestCase):
    @classmethod
    def setUpTestData(cls) -> None:
        cls.alice = make_user("alice", "submitter", password="pw-alice")
        cls.bob = make_user("bob", "submitter")
        cls.vera = make_user("vera", "viewer")
        cls.charlie = make_user("charlie", "operator", password="pw-charlie")
        cls.nobody = make_user("nobody")
        now = timezone.now()

        cls.paused = Run.objects.create(agent="checkout", status=Run.Status.PAUSED,
                                        submitted_by=cls.alice,
                                        input={"email": "a@b.co", "amount": 25000})
        step(cls.paused, "create_customer", 1, update={"customer_id": "cus_1"})
        state = {"email": "a@b.co", "amount": 25000, "currency": "usd", "customer_id": "cus_1"}
        cls.approval = Approval.objects.create(
            run=cls.paused, step_id="t-charge", node="charge_user", requested_at=now,
            payload={"node": "charge_user", "state": state})

        cls.failed = Run.objects.create(
            agent="provision", status=Run.Status.FAILED, submitted_by=cls.alice,
            input={"name": "web-2"},
            error={"type": "ProvisioningFailed", "message": "disk full", "traceback": "Tb..."})
        step(cls.failed, "create_group", 1)
        step(cls.failed, "launch_instance", None, Step.Status.FAILED,
             error={"type": "ProvisioningFailed", "message": "disk full",
                    "traceback": "Traceback (most recent call last):\n  boom"})

        cls.stuck = Run.objects.create(agent="provision", status=Run.Status.NEEDS_ATTENTION,
                                       submitted_by=cls.alice, input={"name": "web-3"})
        step(cls.stuck, "create_group", 1)
        written = step(cls.stuck, "launch_instance", 2)
        allocated = step(cls.stuck, "attach_address", 3,
                         update={"allocation_id": "eipalloc-1", "address": "192.0.2.1"})
        undo_address = Compensation.objects.create(
            run=cls.stuck, step=allocated, node="attach_address", idempotency_key="k-address",
            status=Compensation.Status.FAILED)
        undo_address.attempts.create(number=1, started_at=now, finished_at=now, ok=False,
                                  error={"type": "OSError", "message": "registry locked",
                                         "traceback": "Traceback: registry locked"})
        cls.compensation = undo_address
        undo_config = Compensation.objects.create(
            run=cls.stuck, step=written, node="launch_instance", idempotency_key="k-config",
            status=Compensation.Status.SUCCEEDED)
        undo_config.attempts.create(number=1, started_at=now, finished_at=now, ok=True,
                                    result="True")

        cls.scripted = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED,
                                          submitted_by=cls.alice,
                                          input={"email": "x@y.co", "note": SCRIPT,
                                                 "amount": 100})
        AuditEvent.objects.create(run=cls.scripted, actor="alice", action="run.submitted",
                                  data={"agent": "checkout", "note": SCRIPT})
        cls.bobs = Run.objects.create(agent="provision", status=Run.Status.SUCCEEDED,
                                      submitted_by=cls.bob, input={"name": "bobs-box"})

    def client_for(self, who: str | None, *, csrf: bool = False) -> Client:
        """A logged-in test client (``None``: anonymous). ``csrf=True`` enforces CSRF
        checks, as a browser's requests get them."""
        client = Client(enforce_csrf_checks=csrf)
        if who is not None:
            client.force_login(getattr(self, who))
        return client

    def url(self, run: Run, action: str = "") -> str:
        return f"/runs/{run.code}/" + action
