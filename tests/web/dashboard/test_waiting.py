"""A run whose refund waits out a Stripe outage (RetryLater), as the dashboard shows it: the run
compensating with its next attempt's time, the compensation "waiting to retry" with its attempts
grouped, "Retry now" for an operator, and in no inbox of runs that need a person."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

from django.utils import timezone

from stateguard import records
from stateguard_web.dashboard import labels
from stateguard_web.sagas.models import AuditEvent, Compensation, Run, Step
from tests.web.dashboard.test_views import actions_on
from tests.web.dashboard.world import DashboardWorld, step

DROPPED = {"type": "APIConnectionError", "traceback": "",
           "message": "Unexpected error communicating with Stripe. (connection dropped)"}


class WaitingRunTests(DashboardWorld):
    @classmethod
    def setUpTestData(cls) -> None:
        super().setUpTestData()
        cls.waiting = Run.objects.create(
            agent="checkout", status=Run.Status.COMPENSATING, submitted_by=cls.alice,
            input={"email": "a@b.co", "amount": 4200, "fail_booking": True},
            error={"type": "BookingFailed", "message": "the warehouse rejected the order",
                   "traceback": ""})
        step(cls.waiting, "create_customer", 1, update={"customer_id": "cus_1"})
        charged = step(cls.waiting, "charge_user", 2, update={"payment_intent_id": "pi_1"})
        step(cls.waiting, "book_order", None, Step.Status.FAILED, error=cls.waiting.error)
        cls.retry_at = (timezone.now() + timedelta(minutes=10)).replace(microsecond=0)
        cls.refund = Compensation.objects.create(
            run=cls.waiting, step=charged, node="charge_user", idempotency_key="k-refund",
            status=Compensation.Status.WAITING, retry_at=cls.retry_at)
        start = timezone.now()
        for n in range(1, 6):
            at = start + timedelta(milliseconds=300 * n)
            cls.refund.attempts.create(number=n, started_at=at, finished_at=at, ok=False,
                                       error=DROPPED)

    def page(self, who: str) -> str:
        return self.client_for(who).get(self.url(self.waiting)).content.decode()

    def test_it_shows_the_run_compensating_with_its_next_attempts_time(self) -> None:
        html = self.page("vera")

        assert 'data-run-status="compensating"' in html
        at = self.retry_at.astimezone(UTC).isoformat()
        head = html[html.index('<p class="run-meta">'):]
        head = head[:head.index("</p>")]
        assert re.search(rf'data-next-attempt="{re.escape(self.retry_at.isoformat())}">'
                         rf'next attempt at <time datetime="{re.escape(at)}" data-when>', head)
        undo = html[html.index('data-compensation="charge_user"'):]
        undo = undo[:undo.index("</li>")]
        assert 'data-status="waiting"' in undo and "waiting to retry" in undo
        assert f'next attempt at <time datetime="{at}" data-when>' in undo
        assert re.search(r'<tr data-attempts="5">\s*<td class="num">1\u20135</td>', undo)
        assert "Retry now" not in html  # a viewer may not

    def test_it_shows_no_next_attempt_once_the_run_needs_a_person(self) -> None:
        # A compensating run's waiting undo is retried on its own; once the run needs attention
        # (another undo failed for good), it waits for the person who compensates the run.
        Run.objects.filter(pk=self.waiting.pk).update(status=Run.Status.NEEDS_ATTENTION)
        html = self.page("vera")
        assert "data-next-attempt" not in html and "next attempt at" not in html
        assert 'data-compensation="charge_user" data-status="waiting"' in html

    def test_it_offers_an_operator_to_retry_a_waiting_compensation_now(self) -> None:
        html = self.page("charlie")

        assert actions_on(html) == [f"compensations/{self.refund.pk}/retry"]
        assert 'aria-label="Actions on this run"' not in html  # nothing for the whole run
        assert f'data-dialog="confirm-retry-comp-{self.refund.pk}">Retry now…</button>' in html
        dialog = html[html.index(f'<dialog id="confirm-retry-comp-{self.refund.pk}"'):]
        dialog = dialog[:dialog.index("</dialog>")]
        assert "Retry the compensation of charge_user now?" in dialog
        assert "It waits to be tried again on its own at <time" in dialog

        response = self.client_for("charlie").post(
            self.url(self.waiting, f"compensations/{self.refund.pk}/retry"))

        assert response.status_code == 302
        self.waiting.refresh_from_db()
        assert self.waiting.request is not None
        assert (self.waiting.request["action"], self.waiting.request["step_id"]) == (
            "retry_compensation", self.refund.step.step_id)
        assert AuditEvent.objects.filter(run=self.waiting, actor="charlie",
                                         action="compensation.retry_requested").exists()

    def test_it_lists_a_waiting_run_as_compensating_and_in_no_inbox(self) -> None:
        listed = self.client_for("vera").get("/", {"status": "compensating"}).content.decode()
        assert re.findall(r'<tr id="run-([0-9a-f-]+)"', listed) == [str(self.waiting.code)]
        attention = self.client_for("vera").get("/inbox/attention/").content.decode()
        assert str(self.waiting.code) not in attention
        assert self.client_for("vera").get("/inbox/counts").json()["attention"] == 2  # as before


def test_it_has_words_for_every_status_the_journal_keeps() -> None:
    for kind, statuses in [("run", records.RunStatus), ("step", records.StepStatus),
                           ("compensation", records.CompensationStatus),
                           ("approval", records.ApprovalStatus)]:
        assert {s.value for s in statuses} <= set(labels.LABELS[kind]), kind
    assert labels.label("compensation", "waiting").words == "waiting to retry"
