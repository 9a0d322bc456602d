"""Terminate in the web app: the service's rules and audit, the request a worker carries out
(``tasks.run_request``, in this process, with the deployment's guard), and the journal that
carries it to the worker running the run (``DjangoJournal``'s ``StopJournal``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import TestCase
from django.utils import timezone

from stateguard import RunStatus, StopRequest
from stateguard_web.runs import runtime, services, tasks
from stateguard_web.sagas.journal import DjangoJournal
from stateguard_web.sagas.models import AuditEvent, Compensation, Run, Step
from tests.web.test_services import after_commit


def _steps(run: Run, *nodes: str, kind: str = "compensatable") -> None:
    for seq, node in enumerate(nodes, 1):
        Step.objects.create(run=run, step_id=f"s-{node}", node=node, status="succeeded",
                            done_seq=seq, started_at=timezone.now(), update={"n": seq},
                            state_after={"n": seq}, kind=kind if seq == len(nodes) else
                            "compensatable")


def _held_by(run: Run, owner: str, seconds: float) -> None:
    """A worker's lease on the run, running out in ``seconds`` (past: its worker died)."""
    Run.objects.filter(pk=run.pk).update(
        lease_owner=owner, lease_expires_at=timezone.now() + timedelta(seconds=seconds))


class TerminateServiceTests(TestCase):
    def setUp(self) -> None:
        self.run = Run.objects.create(agent="noop5", input={"n": 0})

    def test_it_cancels_a_pending_run_no_worker_took_at_once(self) -> None:
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            services.run_terminate(run=self.run, by="carol", then="unwind",
                                   reason="submitted twice")
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED and self.run.request is None
        assert self.run.error["type"] == "RunTerminated"
        assert "terminated by carol: submitted twice" in self.run.error["message"]
        assert after_commit(callbacks) == ["live update"]  # no worker needed
        event = AuditEvent.objects.get(run=self.run)
        assert (event.actor, event.action, event.data) == (
            "carol", "run.terminated",
            {"status": "compensated", "then": "unwind", "reason": "submitted twice"})
        # Its queued start finds no pending run: it never runs.
        tasks.run_execute(self.run.pk)
        assert not self.run.steps.exists()

    def test_it_holds_a_pending_run_when_asked(self) -> None:
        services.run_terminate(run=self.run, by="carol", then="hold")
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION
        assert self.run.fencing_token == 1  # a stalled worker that took it is fenced out

    def test_it_leaves_a_request_for_the_worker_that_runs_the_run(self) -> None:
        self.run.status = Run.Status.RUNNING
        self.run.save()
        _held_by(self.run, "w1:1:abc", 30)
        with self.captureOnCommitCallbacks() as callbacks:
            services.run_terminate(run=self.run, by="carol", then="hold", reason="wrong card")
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.RUNNING  # until the worker stops it
        assert {k: self.run.request[k] for k in ("action", "by", "then", "reason")} == {
            "action": "terminate", "by": "carol", "then": "hold", "reason": "wrong card"}
        assert after_commit(callbacks) == ["run_request", "live update"]
        assert AuditEvent.objects.get(run=self.run).action == "run.terminate_requested"
        with pytest.raises(services.ActionNotAllowed, match=r"\(terminate by carol\)"):
            services.run_terminate(run=self.run, by="dave", then="unwind")

    def test_it_refuses_what_does_not_apply_and_changes_nothing(self) -> None:
        self.run.status = Run.Status.SUCCEEDED
        self.run.save()
        with pytest.raises(services.ActionNotAllowed, match="is succeeded; only a pending or "
                                                            "running run is terminated"):
            services.run_terminate(run=self.run, by="carol", then="unwind")
        with pytest.raises(services.SubmissionError, match="then must be unwind or hold"):
            services.run_terminate(run=self.run, by="carol", then="stop")
        with pytest.raises(services.ActionNotAllowed, match="NUL"):
            services.run_terminate(run=self.run, by="carol", then="hold", reason="a\x00")
        # Past its pivot: not unwound (half a saga), held it may be.
        self.run.status = Run.Status.RUNNING
        self.run.save()
        _steps(self.run, "step1", "step2", kind="pivot")
        with pytest.raises(services.ActionNotAllowed, match="passed its pivot 'step2'"):
            services.run_terminate(run=self.run, by="carol", then="unwind")
        assert not AuditEvent.objects.exists()
        services.run_terminate(run=self.run, by="carol", then="hold")
        assert Run.objects.get(pk=self.run.pk).request["then"] == "hold"


@pytest.fixture
def bench_agents(settings: Any) -> None:
    settings.STATEGUARD_BENCH_AGENTS = True


@pytest.mark.usefixtures("bench_agents")
class TerminateWorkerTests(TestCase):
    """The request carried out by ``run_request`` with the deployment's guard (noop5's steps
    and compensations, which touch nothing)."""

    def setUp(self) -> None:
        self.run = Run.objects.create(agent="noop5", input={"n": 0},
                                      status=Run.Status.RUNNING)
        _steps(self.run, "step1", "step2")

    def _request(self, then: str) -> None:
        with self.captureOnCommitCallbacks():
            services.run_terminate(run=self.run, by="carol", then=then, reason="stuck")
        self.run.refresh_from_db()

    def test_a_worker_backs_off_while_another_runs_the_run_and_keeps_the_request(self) -> None:
        _held_by(self.run, "w1:1:abc", 30)
        self._request("unwind")
        tasks.run_request.apply(args=(self.run.pk, self.run.request["id"]))
        self.run.refresh_from_db()
        # The worker holding it sees the request at its lease's next heartbeat: left for it.
        assert self.run.request["action"] == "terminate"
        assert self.run.status == Run.Status.RUNNING

    def test_it_unwinds_a_run_whose_worker_died_newest_first(self) -> None:
        _held_by(self.run, "w1:1:abc", -30)  # its lease ran out: its worker is gone
        self._request("unwind")
        tasks.run_request.apply(args=(self.run.pk, self.run.request["id"]))
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED and self.run.request is None
        comps = Compensation.objects.filter(run=self.run).order_by("created_at", "pk")
        assert [(c.node, c.status, c.triggered_by) for c in comps] == [
            ("step2", "succeeded", "carol"), ("step1", "succeeded", "carol")]
        done = AuditEvent.objects.get(run=self.run, action="run.terminated")
        assert (done.actor, done.data["status"], done.data["requested_by"]) == (
            "worker", "compensated", "carol")
        assert self.run.error["type"] == "RunTerminated"

    def test_it_holds_a_run_whose_worker_died_as_asked(self) -> None:
        _held_by(self.run, "w1:1:abc", -30)
        self._request("hold")
        tasks.run_request.apply(args=(self.run.pk, self.run.request["id"]))
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION and self.run.request is None
        assert not Compensation.objects.filter(run=self.run).exists()
        assert "terminated by carol: stuck" in self.run.error["message"]

    def test_a_request_the_run_outgrew_is_refused_and_audited(self) -> None:
        self._request("unwind")
        Run.objects.filter(pk=self.run.pk).update(status=Run.Status.SUCCEEDED)  # it finished
        tasks.run_request.apply(args=(self.run.pk, self.run.request["id"]))
        refused = AuditEvent.objects.get(run=self.run, action="run.request_refused")
        assert "is succeeded; only a pending or running run is terminated" in refused.data[
            "reason"]
        assert Run.objects.get(pk=self.run.pk).request is None


class StopJournalTests(TestCase):
    """``DjangoJournal`` as the core's ``StopJournal``: the request on the run, read with the
    lease (no round trip more) and at each heartbeat, cleared once carried out."""

    def test_it_reads_the_request_with_the_lease_and_clears_it_once_done(self) -> None:
        run = Run.objects.create(agent="noop5", status=Run.Status.RUNNING)
        journal = DjangoJournal()
        code = str(run.code)
        assert journal.lock_acquire(code, "w1", 30)
        assert journal.run_stop_requested(code) is None
        Run.objects.filter(pk=run.pk).update(request={
            "id": "r1", "action": "terminate", "by": "carol", "then": "hold", "reason": "x"})
        assert journal.run_stop_requested(code) == StopRequest("hold", "carol", "x", id="r1")
        journal.lock_release(code, "w1")

        assert journal.lock_acquire(code, "w2", 30)  # read by the statement that took it
        with self.assertNumQueries(0):
            stop = journal.run_stop_requested(code)
        assert stop is not None and stop.id == "r1"
        journal.run_stop_done(code, stop, RunStatus.NEEDS_ATTENTION)
        run.refresh_from_db()
        assert run.request is None
        assert AuditEvent.objects.get(run=run).data == {
            "then": "hold", "requested_by": "carol", "status": "needs_attention", "reason": "x"}
        journal.lock_release(code, "w2")

    def test_another_request_is_no_stop(self) -> None:
        run = Run.objects.create(agent="noop5", status=Run.Status.FAILED,
                                 request={"id": "r2", "action": "retry", "by": "carol"})
        assert runtime.journal().run_stop_requested(str(run.code)) is None
