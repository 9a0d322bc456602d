"""Compensations that wait out an outage (RetryLater) in the web app: the deployment's policy,
and the sweeper, which hands a waiting run to its next round once that is due, never before,
and a run whose worker died mid-round to recovery as after any crash. Real workers and a
Stripe outage: test_checkout_outage.py."""

from __future__ import annotations

from datetime import timedelta

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase, override_settings
from django.utils import timezone

from stateguard import RetryLater
from stateguard_web.runs import runtime, tasks
from stateguard_web.sagas.models import Compensation, Run, Step
from tests.web.conftest import ManagePy
from tests.web.test_decisions import queued_tasks


def test_it_waits_as_the_deployment_says_or_not_at_all() -> None:
    assert runtime.retry_later() == RetryLater(initial=30, cap=3600, budget=86400)
    with override_settings(STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL=5,
                           STATEGUARD_COMPENSATION_RETRY_LATER_CAP=60,
                           STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET=600):
        assert runtime.retry_later() == RetryLater(initial=5, cap=60, budget=600)
    with override_settings(STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET=0):
        assert runtime.retry_later() is None


def test_it_refuses_to_start_with_a_wait_that_makes_no_sense(manage_py: ManagePy) -> None:
    for env in ({"STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL": "0"},
                {"STATEGUARD_COMPENSATION_RETRY_LATER_INITIAL": "120",
                 "STATEGUARD_COMPENSATION_RETRY_LATER_CAP": "60"},
                {"STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET": "-1"},
                {"STATEGUARD_COMPENSATION_RETRY_LATER_BUDGET": "nan"},
                {"STATEGUARD_COMPENSATION_RETRY_LATER_CAP": "an hour"}):
        result = manage_py("check", env=env)
        assert result.returncode != 0, env
        (last,) = result.stderr.strip().splitlines()[-1:]
        assert last.startswith(f"django.core.exceptions.{ImproperlyConfigured.__name__}: "
                               "STATEGUARD_COMPENSATION_RETRY_LATER_"), env


class SweeperTests(TestCase):
    """The sweeper in this process, as the beat runs it; what it queues is read from Redis."""

    def setUp(self) -> None:
        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
        now = timezone.now()
        # Its worker let go of it an hour ago: by the lease alone, abandoned.
        self.run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATING,
                                      input={"email": "a@b.co", "amount": 4200})
        step = Step.objects.create(run=self.run, step_id="t-charge", node="charge_user",
                                   status=Step.Status.SUCCEEDED, started_at=now,
                                   finished_at=now, done_seq=1)
        self.refund = Compensation.objects.create(
            run=self.run, step=step, node="charge_user", idempotency_key="k-refund",
            status=Compensation.Status.WAITING, retry_at=now + timedelta(minutes=10))
        Run.objects.filter(pk=self.run.pk).update(updated_at=now - timedelta(hours=1))

    def due(self, ago: timedelta = timedelta(0)) -> None:
        Compensation.objects.filter(pk=self.refund.pk).update(retry_at=timezone.now() - ago)

    def test_it_leaves_a_waiting_run_alone_until_its_next_round_is_due(self) -> None:
        for _ in range(3):  # a sweep every few seconds
            tasks.sweep_expired_leases()
        assert queued_tasks() == []

        self.due()
        for _ in range(3):  # the round waits in the queue meanwhile: queued once
            tasks.sweep_expired_leases()
        assert queued_tasks() == ["run_retry_compensations"]

    def test_it_hands_each_due_time_over_once_however_short_the_wait(self) -> None:
        self.due(ago=timedelta(seconds=1))
        tasks.sweep_expired_leases()
        # Its round failed and waits again, a moment: within the same lease period.
        Compensation.objects.filter(pk=self.refund.pk).update(retry_at=timezone.now())
        tasks.sweep_expired_leases()
        tasks.sweep_expired_leases()
        assert queued_tasks() == ["run_retry_compensations"] * 2

    def test_it_hands_a_run_whose_worker_died_mid_round_to_recovery(self) -> None:
        Run.objects.filter(pk=self.run.pk).update(
            lease_owner="w1", lease_expires_at=timezone.now() - timedelta(seconds=1))
        tasks.sweep_expired_leases()
        assert queued_tasks() == ["run_recover"]

    def test_it_leaves_a_due_run_to_the_worker_that_holds_it(self) -> None:
        self.due()
        Run.objects.filter(pk=self.run.pk).update(
            lease_owner="w1", lease_expires_at=timezone.now() + timedelta(seconds=10))
        tasks.sweep_expired_leases()
        assert queued_tasks() == []

    def test_its_round_does_nothing_before_it_is_due(self) -> None:
        tasks.run_retry_compensations(self.run.pk)  # a delivery of a round already run
        self.refund.refresh_from_db()
        self.run.refresh_from_db()
        assert (self.refund.status, self.refund.attempts.count()) == ("waiting", 0)
        assert (self.run.status, self.run.fencing_token) == ("compensating", 0)  # no lease
