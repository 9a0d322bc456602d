"""Approvals are decided in the operator's request, once; a worker carries the decision out."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Approval, AuditEvent, Run


def queued_tasks() -> list[str]:
    """The names of the tasks waiting in the broker's queues (runs', then operations')."""
    import json

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return [json.loads(m)["headers"]["task"].rsplit(".", 1)[-1]
            for queue in ("celery", settings.STATEGUARD_OPS_QUEUE)
            for m in broker.lrange(queue, 0, -1)]


class ConcurrentDecisionTests(TransactionTestCase):
    def setUp(self) -> None:
        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
        self.run = Run.objects.create(agent="checkout", status=Run.Status.PAUSED)
        self.approval = Approval.objects.create(run=self.run, step_id="t1", node="charge_user",
                                                requested_at=timezone.now())

    def test_it_accepts_exactly_one_of_twenty_concurrent_decisions(self) -> None:
        start = threading.Barrier(20)
        accepted: list[str] = []
        refused: list[str] = []

        def decide(i: int) -> None:
            who = f"op{i}"
            try:
                start.wait()
                if i % 2:
                    services.run_approve(run=self.run, by=who)
                else:
                    services.run_reject(run=self.run, by=who, reason="no")
                accepted.append(who)
            except services.ActionNotAllowed as exc:
                refused.append(str(exc))
            finally:
                connection.close()  # each thread has a connection of its own

        threads = [threading.Thread(target=decide, args=(i,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

        assert len(accepted) == 1 and len(refused) == 19
        (winner,) = accepted
        self.approval.refresh_from_db()
        assert self.approval.decided_by == winner
        assert self.approval.status == ("approved" if int(winner[2:]) % 2 else "rejected")
        decisions = AuditEvent.objects.filter(run=self.run,
                                              action__in=["run.approved", "run.rejected"])
        assert [e.actor for e in decisions] == [winner]  # the trail says what really happened
        assert queued_tasks() == ["run_request"]


class SweeperTests(TestCase):
    def setUp(self) -> None:
        self.broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        self.broker.flushdb()

    def test_it_queues_a_lost_run_once_per_lease_period(self) -> None:
        long_ago = timezone.now() - timedelta(hours=1)
        lost = Run.objects.create(agent="provision", input={"name": "x"})
        Run.objects.create(agent="provision", status=Run.Status.RUNNING,
                                  lease_owner="w1", lease_expires_at=long_ago)
        Run.objects.filter(pk=lost.pk).update(created_at=long_ago)

        for _ in range(5):  # a sweep every few seconds, while no worker gets to the queue
            tasks.sweep_expired_leases()
        assert sorted(queued_tasks()) == ["run_execute", "run_recover"]

        Run.objects.update(requeued_at=timezone.now() - timedelta(
            seconds=settings.STATEGUARD_LEASE_SECONDS + 1))  # a lease period later
        tasks.sweep_expired_leases()
        # The dead worker's run again; not the pending one: its message still waits.
        assert sorted(queued_tasks()) == ["run_execute", "run_recover", "run_recover"]

        self.broker.delete("celery")  # that message is lost too
        Run.objects.update(requeued_at=timezone.now() - timedelta(
            seconds=settings.STATEGUARD_LEASE_SECONDS + 1))
        tasks.sweep_expired_leases()
        assert sorted(queued_tasks()) == ["run_execute", "run_recover", "run_recover",
                                          "run_recover"]

    def test_it_leaves_pending_runs_alone_while_their_messages_may_wait_in_the_queue(
            self) -> None:
        # A backlog: three runs submitted long ago wait behind each other, their messages in
        # the queue. However long they wait, none is queued again...
        long_ago = timezone.now() - timedelta(hours=1)
        runs = []
        for minutes in (3, 2, 1):  # the oldest first
            with self.captureOnCommitCallbacks(execute=True):
                runs.append(services.run_submit(agent="provision", input={"name": "x"}))
            Run.objects.filter(pk=runs[-1].pk).update(
                created_at=long_ago - timedelta(minutes=minutes))
        for _ in range(3):
            tasks.sweep_expired_leases()
        assert queued_tasks() == ["run_execute"] * 3

        # ...until the queue is shorter than the backlog: the two oldest messages are gone
        # (Redis lost them, say) while their runs are still pending.
        self.broker.rpop("celery")
        self.broker.rpop("celery")
        tasks.sweep_expired_leases()
        again = [json.loads(m)["headers"]["argsrepr"] for m in self.broker.lrange("celery", 0, 1)]
        assert sorted(again) == sorted(f"({r.pk},)" for r in runs[:2])
        assert self.broker.llen("celery") == 3

    def test_it_leaves_alone_a_pending_run_a_worker_is_starting(self) -> None:
        # Its message taken from the queue, its lease taken, not yet written "running".
        long_ago = timezone.now() - timedelta(hours=1)
        starting = Run.objects.create(agent="provision", input={"name": "x"}, lease_owner="w9",
                                      lease_expires_at=timezone.now() + timedelta(seconds=30))
        Run.objects.filter(pk=starting.pk).update(created_at=long_ago)
        tasks.sweep_expired_leases()
        assert queued_tasks() == []

    def test_it_queues_again_a_request_no_worker_carried_out(self) -> None:
        run = Run.objects.create(agent="checkout", status=Run.Status.FAILED)
        with self.captureOnCommitCallbacks():  # its message is lost
            services.run_retry(run=run, by="bob")
        Run.objects.filter(pk=run.pk).update(requested_at=timezone.now() - timedelta(minutes=5))
        tasks.sweep_expired_leases()
        tasks.sweep_expired_leases()
        assert queued_tasks() == ["run_request"]

    def test_it_moves_a_run_of_an_unknown_agent_to_needs_attention(self) -> None:
        run = Run.objects.create(agent="retired-agent", input={})
        tasks.run_execute(run.pk)
        run.refresh_from_db()
        assert run.status == Run.Status.NEEDS_ATTENTION
        assert run.error["type"] == "UnknownAgent" and "'retired-agent'" in run.error["message"]
        assert AuditEvent.objects.filter(run=run, action="run.agent_unknown").exists()
        tasks.sweep_expired_leases()
        assert queued_tasks() == []  # not queued again, for ever

    def test_it_refuses_a_request_on_a_waiting_run_of_an_unknown_agent(self) -> None:
        run = Run.objects.create(agent="retired-agent", status=Run.Status.FAILED)
        with self.captureOnCommitCallbacks():
            services.run_retry(run=run, by="bob")
        run.refresh_from_db()
        tasks.run_request(run.pk, run.request["id"])  # as a worker would, from the queue
        run.refresh_from_db()
        assert run.status == Run.Status.FAILED and run.request is None  # left as it was
        refused = AuditEvent.objects.get(run=run, action="run.request_refused")
        assert "'retired-agent' is not offered" in refused.data["reason"]


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_it_carries_out_the_decision_with_the_agent_graph(
        decision: str, transactional_db: None, settings: Any, localstripe_url: str) -> None:
    settings.STRIPE_API_BASE = localstripe_url
    run = services.run_submit(agent="checkout",
                              input={"email": "a@b.co", "amount": 25000, "fail_booking": False})
    tasks.run_execute(run.pk)  # above 100.00: the charge waits for an approval
    run.refresh_from_db()
    assert run.status == Run.Status.PAUSED
    if decision == "approve":
        services.run_approve(run=run, by="alice")
    else:
        services.run_reject(run=run, by="bob", reason="looks like fraud")
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])  # as a worker would, from the queue
    tasks.run_request(run.pk, run.request["id"])  # the broker delivers it a second time
    run.refresh_from_db()
    assert run.status == ("succeeded" if decision == "approve" else "compensated")
    assert run.steps.filter(node="charge_user").exists() == (decision == "approve")
    assert run.request is None
    # The duplicate found nothing to do, and said nothing false in the audit trail.
    assert not AuditEvent.objects.filter(run=run, action="run.request_refused").exists()
