"""Submissions and operator actions: validation, audit, enqueueing on commit."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import TestCase
from django.utils import timezone

from stateguard_web.runs import queue, services
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step


def after_commit(callbacks: list[Callable[[], Any]]) -> list[str]:
    """What a service left for after its commit: a task's name (Celery's ``delay_on_commit``,
    or ``runs.queue.send_on_commit``), or "live update" (the dashboard's,
    sagas.events.publish_change)."""
    def name(c: Callable[[], Any]) -> str:
        if not isinstance(c, functools.partial):
            return "live update"
        task = c.args[0] if c.func is queue.send else c.func.__self__
        return str(task.name).rsplit(".", 1)[-1]

    return [name(c) for c in callbacks]


class SubmitTests(TestCase):
    def setUp(self) -> None:
        self.alice = get_user_model().objects.create_user("alice")

    def test_it_stores_the_validated_input_and_queues_the_run_after_commit(self) -> None:
        with self.captureOnCommitCallbacks() as callbacks:
            run = services.run_submit(agent="provision", input='{"name": "web-1"}',
                                      by=self.alice)
        assert run.status == Run.Status.PENDING and run.submitted_by == self.alice
        assert run.input == {"name": "web-1", "instance_type": "t3.micro", "fail_at": None,
                             "hold_failure": False, "sleep_at": None, "sleep_seconds": 0.0,
                             "sleep_after_effect": False}
        # run_execute, and the run for the live pages, sent only once the run is committed
        assert after_commit(callbacks) == ["run_execute", "live update"]
        assert AuditEvent.objects.get(run=run).action == "run.submitted"

    def test_it_refuses_bad_input_and_stores_nothing(self) -> None:
        cases = [
            ("nope", {}, "unknown agent"),
            ("provision", "{not json", "not valid JSON"),
            ("provision", "[1, 2]", "JSON object"),
            ("provision", {"name": "Bad Name!"}, "does not fit"),
            ("provision", {"name": "ok", "instance_type": "p5.48xlarge"}, "does not fit"),
            ("provision", {"name": "ok", "surprise": 1}, "does not fit"),
            ("checkout", {"email": "not-an-email", "amount": 5}, "does not fit"),
            ("checkout", {"email": "a\u0000@b.co", "amount": 5}, "NUL"),
        ]
        for agent, data, message in cases:
            with self.subTest(agent=agent, data=data), \
                    pytest.raises(services.SubmissionError, match=message):
                services.run_submit(agent=agent, input=data)
        assert not Run.objects.exists() and not AuditEvent.objects.exists()

    def test_it_names_the_fields_that_fail(self) -> None:
        with pytest.raises(services.SubmissionError) as caught:
            services.run_submit(agent="provision", input={"instance_type": "huge"})
        assert {tuple(e["loc"]) for e in caught.value.errors} == {("name",),
                                                                  ("instance_type",)}


class ActionTests(TestCase):
    def setUp(self) -> None:
        self.run = Run.objects.create(agent="checkout", status=Run.Status.PAUSED)

    def test_it_decides_an_approval_audits_it_and_queues_its_carrying_out(self) -> None:
        approval = Approval.objects.create(run=self.run, step_id="t1", node="charge_user",
                                           requested_at=self.run.created_at)
        with self.captureOnCommitCallbacks() as callbacks:
            services.run_approve(run=self.run, by="bob")
        assert after_commit(callbacks) == ["run_request", "live update"]
        event = AuditEvent.objects.get(run=self.run)
        assert (event.actor, event.action, event.data) == (
            "bob", "run.approved", {"node": "charge_user", "step_id": "t1"})
        approval.refresh_from_db()
        assert (approval.status, approval.decided_by) == ("approved", "bob")

    def test_it_holds_back_other_requests_until_a_worker_carries_one_out(self) -> None:
        Approval.objects.create(run=self.run, step_id="t1", node="charge_user",
                                requested_at=self.run.created_at)
        with self.captureOnCommitCallbacks():  # the worker has not carried it out yet
            services.run_compensate(run=self.run, by="carol")
        for action in (services.run_approve, services.run_reject, services.run_compensate):
            with self.subTest(action=action.__name__), \
                    pytest.raises(services.ActionNotAllowed, match="compensate by carol"):
                action(run=self.run, by="bob")
        assert Approval.objects.get().status == "pending"  # not decided behind the request
        assert AuditEvent.objects.filter(run=self.run).count() == 1

    def test_it_refuses_actions_that_do_not_fit_the_run(self) -> None:
        with pytest.raises(services.ActionNotAllowed, match="0 pending approvals"):
            services.run_approve(run=self.run, by="bob")
        with pytest.raises(services.ActionNotAllowed, match="only a failed run"):
            services.run_retry(run=self.run, by="bob")
        with pytest.raises(services.ActionNotAllowed, match="only a run that needs"):
            services.run_resolve_by_hand(run=self.run, by="bob", note="refunded by hand")
        assert not AuditEvent.objects.exists()

    def test_it_refuses_decisions_on_a_run_that_is_not_paused(self) -> None:
        Approval.objects.create(run=self.run, step_id="t1", node="charge_user",
                                requested_at=self.run.created_at)
        self.run.status = Run.Status.COMPENSATED
        self.run.save()
        with pytest.raises(services.ActionNotAllowed, match="only a paused run"):
            services.run_approve(run=self.run, by="bob")
        with pytest.raises(services.ActionNotAllowed, match="only a paused run"):
            services.run_reject(run=self.run, by="bob")

    def test_it_refuses_operator_text_the_database_cannot_hold(self) -> None:
        self.run.status = Run.Status.NEEDS_ATTENTION
        self.run.save()
        with pytest.raises(services.ActionNotAllowed, match="NUL"):
            services.run_resolve_by_hand(run=self.run, by="carol", note="done\x00")
        with pytest.raises(services.ActionNotAllowed, match="longer than"):
            services.run_resolve_by_hand(run=self.run, by="carol", note="x" * 5000)
        services.run_resolve_by_hand(run=self.run, by="c" * 400, note="refunded by hand")
        assert AuditEvent.objects.get(run=self.run).actor == "c" * 150

    def test_it_refuses_to_resolve_by_hand_while_a_compensation_request_waits(self) -> None:
        self.run.agent, self.run.status = "provision", Run.Status.NEEDS_ATTENTION
        self.run.save()
        with self.captureOnCommitCallbacks():  # the compensate request is queued, not run yet
            services.run_compensate(run=self.run, by="dave")
        with pytest.raises(services.ActionNotAllowed, match=r"waiting for a worker "
                                                            r"\(compensate by dave\)"):
            services.run_resolve_by_hand(run=self.run, by="carol", note="undone by hand")
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION

    def test_it_checks_a_compensation_request_under_the_lease(self) -> None:
        # The run is settled by another way (the admin, another deployment's worker) after the
        # worker read the run and before it took the lease: the unwind must not run the failed
        # compensation again over it.
        from stateguard_web.runs import runtime, tasks

        self.run.agent, self.run.status = "provision", Run.Status.NEEDS_ATTENTION
        self.run.save()
        step = Step.objects.create(run=self.run, step_id="s1", node="create_group",
                                   status="succeeded", done_seq=1, started_at=timezone.now(),
                                   state_after={"name": "web-1"})
        failed = Compensation.objects.create(run=self.run, step=step, node="create_group",
                                             idempotency_key="k1", status="failed")
        with self.captureOnCommitCallbacks():
            services.run_compensate(run=self.run, by="dave")
        self.run.refresh_from_db()
        journal = runtime.journal()
        take_lease = journal.lock_acquire

        def settled_just_before(run_id: str, owner: str, ttl: float) -> bool:
            Run.objects.filter(pk=self.run.pk).update(status=Run.Status.COMPENSATED)
            return take_lease(run_id, owner, ttl)

        with mock.patch.object(journal, "lock_acquire", settled_just_before):
            tasks.run_request.apply(args=(self.run.pk, self.run.request["id"]))
        self.run.refresh_from_db()
        failed.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        assert (failed.status, failed.attempts.count()) == ("failed", 0)  # not run again
        refused = AuditEvent.objects.get(run=self.run, action="run.request_refused")
        assert refused.data["request"] == "compensate" and "is compensated" in refused.data[
            "reason"]
        assert self.run.request is None  # refused is done with: the run takes requests again

    def test_it_resolves_a_run_by_hand_with_a_note(self) -> None:
        self.run.status = Run.Status.NEEDS_ATTENTION
        self.run.save()
        with pytest.raises(services.ActionNotAllowed, match="say what"):
            services.run_resolve_by_hand(run=self.run, by="carol", note="  ")
        services.run_resolve_by_hand(run=self.run, by="carol", note="refunded in Stripe")
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        assert AuditEvent.objects.get(run=self.run).data == {"note": "refunded in Stripe"}


class CommandTests(TestCase):
    def test_it_submits_a_run_and_prints_its_uuid_then_its_status(self) -> None:
        from io import StringIO

        out = StringIO()
        call_command("submit_run", "provision", "--input", '{"name": "cli-1"}', stdout=out)
        code = out.getvalue().strip()
        assert Run.objects.get(code=code).agent == "provision"
        out = StringIO()
        call_command("run_status", code, stdout=out)
        assert json.loads(out.getvalue())["status"] == "pending"

    def test_it_fails_clearly_on_bad_input(self) -> None:
        with pytest.raises(CommandError, match="unknown agent"):
            call_command("submit_run", "nope")
        with pytest.raises(CommandError, match=r"name: String should match"):
            call_command("submit_run", "provision", "--input", '{"name": "NO"}')
        with pytest.raises(CommandError, match="not a run id"):
            call_command("run_status", "not-a-uuid")
        assert not Run.objects.exists()


class RecoveryTests(TestCase):
    def test_it_requeues_a_claimed_run_whose_worker_died_before_its_first_step(self) -> None:
        import json as _json
        from datetime import timedelta

        import redis
        from django.conf import settings
        from django.utils import timezone

        from stateguard_web.runs import tasks

        broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        broker.delete("celery")
        run = Run.objects.create(agent="provision", input={"name": "x"},
                                 status=Run.Status.RUNNING, lease_owner="dead-worker",
                                 lease_expires_at=timezone.now() - timedelta(seconds=1))
        tasks.run_recover.apply(args=(run.pk,))
        run.refresh_from_db()
        assert run.status == Run.Status.PENDING
        (message,) = [_json.loads(m) for m in broker.lrange("celery", 0, -1)]
        assert message["headers"]["task"] == "stateguard_web.sagas.tasks.run_execute"
        assert message["headers"]["argsrepr"] == f"({run.pk},)"


class IdempotentSubmitTests(TestCase):
    def setUp(self) -> None:
        self.alice = get_user_model().objects.create_user("alice")
        self.bob = get_user_model().objects.create_user("bob")

    def test_it_gives_back_the_first_run_for_the_same_key_and_submission(self) -> None:
        first = services.run_submit(agent="provision", input={"name": "web-1"}, by=self.alice,
                                    idempotency_key="k-1")
        again = services.run_submit(agent="provision", input={"name": "web-1"}, by=self.alice,
                                    idempotency_key="k-1")
        assert (first.replayed, again.replayed, again.pk) == (False, True, first.pk)
        other_user = services.run_submit(agent="provision", input={"name": "web-1"},
                                         by=self.bob, idempotency_key="k-1")
        assert other_user.pk != first.pk  # keys are per user
        assert Run.objects.count() == 2
        assert AuditEvent.objects.filter(action="run.submitted").count() == 2

    def test_it_refuses_the_same_key_for_another_submission(self) -> None:
        services.run_submit(agent="provision", input={"name": "web-1"}, by=self.alice,
                            idempotency_key="k-2")
        with pytest.raises(services.IdempotencyConflict, match="another submission"):
            services.run_submit(agent="provision", input={"name": "web-2"}, by=self.alice,
                                idempotency_key="k-2")
        with pytest.raises(services.SubmissionError, match="needs a user"):
            services.run_submit(agent="provision", input={"name": "web-1"}, by="cli:root",
                                idempotency_key="k-3")
        assert Run.objects.count() == 1

    def test_it_names_the_key_used_in_the_audit_trail(self) -> None:
        run = services.run_submit(agent="provision", input={"name": "web-1"},
                                  by=services.Actor(self.alice, via="key sg_ab12"))
        event = AuditEvent.objects.get(run=run)
        assert (event.actor, event.data["via"]) == ("alice", "key sg_ab12")
        assert run.submitted_by == self.alice


class CompensationRetryTests(TestCase):
    def test_it_queues_a_retry_of_one_failed_compensation_only(self) -> None:
        run = Run.objects.create(agent="provision", status=Run.Status.NEEDS_ATTENTION)
        step = Step.objects.create(run=run, step_id="s1", node="attach_address",
                                   status="succeeded", started_at=timezone.now())
        done_step = Step.objects.create(run=run, step_id="s2", node="create_group",
                                        status="succeeded", started_at=timezone.now())
        failed = Compensation.objects.create(run=run, step=step, node="attach_address",
                                             idempotency_key="k1", status="failed")
        done = Compensation.objects.create(run=run, step=done_step, node="create_group",
                                           idempotency_key="k2", status="succeeded")
        with pytest.raises(services.ActionNotAllowed, match="is succeeded; only a failed"):
            services.compensation_retry(compensation=done, by="carol")
        with self.captureOnCommitCallbacks() as callbacks:
            services.compensation_retry(compensation=failed, by="carol")
        run.refresh_from_db()
        assert after_commit(callbacks) == ["run_request", "live update"]
        assert (run.request["action"], run.request["step_id"]) == ("retry_compensation", "s1")
        with pytest.raises(services.ActionNotAllowed, match="retry_compensation by carol"):
            services.compensation_retry(compensation=failed, by="dave")
