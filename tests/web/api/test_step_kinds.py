"""Step kinds in the web app: the API's run detail gives each step's kind, and a run past its
pivot (the point of no return) is not compensated or rejected: the action is refused (409). A
run held past its pivot, nothing of it undone, is retried forward instead."""

from __future__ import annotations

from django.utils import timezone

from stateguard_web.sagas.models import AuditEvent, Run, Step
from tests.web.api.world import World, journal_state


class StepKindTests(World):
    def setUp(self) -> None:
        now = timezone.now()
        Step.objects.create(run=self.stuck, step_id="t-ship", node="ship_order",
                            kind="pivot", status=Step.Status.SUCCEEDED,
                            started_at=now, finished_at=now, done_seq=2)
        Step.objects.create(run=self.stuck, step_id="t-mail", node="send_email",
                            kind="retriable", status=Step.Status.FAILED, attempt=3,
                            started_at=now, finished_at=now)

    def test_it_shows_each_steps_kind(self) -> None:
        response = self.call("vera", "GET", f"/api/runs/{self.stuck.code}")
        assert response.status_code == 200
        assert [(s["node"], s["kind"], s["attempt"]) for s in response.json()["steps"]] == [
            ("charge_user", "compensatable", 1), ("ship_order", "pivot", 1),
            ("send_email", "retriable", 3)]

    def test_it_refuses_to_compensate_a_run_past_its_pivot(self) -> None:
        before = journal_state()
        response = self.call("charlie", "POST", f"/api/runs/{self.stuck.code}/compensate")

        assert (response.status_code, response.json()["code"]) == (409, "not_allowed_now")
        assert "passed its pivot 'ship_order'" in response.json()["detail"]
        assert "half a saga" in response.json()["detail"]
        assert journal_state() == before

    def test_it_still_compensates_a_run_whose_pivot_never_succeeded(self) -> None:
        Step.objects.filter(step_id="t-ship").update(status=Step.Status.FAILED, done_seq=None)
        response = self.call("charlie", "POST", f"/api/runs/{self.stuck.code}/compensate")
        assert response.status_code == 202

    def test_it_retries_forward_a_run_held_past_its_pivot(self) -> None:
        now = timezone.now()
        held = Run.objects.create(agent="checkout", status=Run.Status.NEEDS_ATTENTION,
                                  submitted_by=self.alice, input={"email": "e@f.co"})
        for step_id, node, kind, status in [
                ("h-charge", "charge_user", "compensatable", Step.Status.SUCCEEDED),
                ("h-ship", "ship_order", "pivot", Step.Status.SUCCEEDED),
                ("h-mail", "send_email", "retriable", Step.Status.FAILED)]:
            Step.objects.create(run=held, step_id=step_id, node=node, kind=kind,
                                status=status, started_at=now)
        response = self.call("charlie", "POST", f"/api/runs/{held.code}/compensate")
        assert "(retry it, or resolve it by hand)" in response.json()["detail"]

        response = self.call("charlie", "POST", f"/api/runs/{held.code}/retry")

        assert response.status_code == 202, response.json()
        assert (response.json()["request"]["action"], response.json()["status"]) == (
            "retry", "needs_attention")  # until a worker takes it up
        assert AuditEvent.objects.filter(run=held, action="run.retry_requested").exists()
        # It waits for its worker: the run's page and the sweeper see it as waiting.
        held.refresh_from_db()
        assert held.waiting_request == "retry by charlie"

    def test_it_refuses_to_retry_a_run_past_its_pivot_that_was_partly_undone(self) -> None:
        # The stuck run's charge has a failed compensation: half unwound, not retried.
        before = journal_state()
        response = self.call("charlie", "POST", f"/api/runs/{self.stuck.code}/retry")

        assert (response.status_code, response.json()["code"]) == (409, "not_allowed_now")
        assert "passed its pivot 'ship_order' but was partly undone" in response.json()["detail"]
        assert journal_state() == before
