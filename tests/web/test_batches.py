"""Batches (batches/services.py): the frozen selection, each run checked and acted on through the
services on its own, skipped with the reason, cancel, bad selections, the lease and the
sweeper, and two workers on one batch. The batch task runs in this process as a worker would;
issue 11's acceptance test (50 runs, live progress) is test_batch_acceptance.py, the killed
worker test_batch_crash.py."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
import time_machine
from django.db import connection, transaction
from django.test import TestCase, override_settings
from django.utils import timezone

from stateguard_web.batches import services as batches
from stateguard_web.batches import tasks as batch_tasks
from stateguard_web.batches import worker as batch_worker
from stateguard_web.runs import services
from stateguard_web.sagas.journal.leases import db_now
from stateguard_web.sagas.models import AuditEvent, Batch, BatchItem, Compensation, Run, Step
from tests.web.api.world import make_user


def process(batch: Batch, owner: str = "w1", budget: float = 60) -> None:
    """What workers do with the batch's task until it is finished (it queues itself again)."""
    while batch_worker.batch_process(batch_pk=batch.pk, owner=owner, budget=budget):
        pass


def outcomes(batch: Batch) -> list[tuple[uuid.UUID, str, str]]:
    return list(batch.items.order_by("position").values_list("run_code", "outcome", "reason"))


class BatchTests(TestCase):
    @classmethod
    def setUpTestData(cls) -> None:
        cls.charlie = make_user("charlie", "operator")
        cls.bob = make_user("bob", "operator")
        cls.f1, cls.f2, cls.f3 = (Run.objects.create(agent="checkout", status=Run.Status.FAILED)
                                  for _ in range(3))
        cls.done = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        cls.stuck = Run.objects.create(agent="checkout", status=Run.Status.NEEDS_ATTENTION)
        now = timezone.now()
        step = Step.objects.create(run=cls.stuck, step_id="s1", node="charge_user",
                                   status=Step.Status.SUCCEEDED, started_at=now)
        Compensation.objects.create(run=cls.stuck, step=step, node="charge_user",
                                    idempotency_key="k1", status=Compensation.Status.FAILED)
        cls.parked = Run.objects.create(agent="retired", status=Run.Status.NEEDS_ATTENTION)

    def create(self, action: str = "compensate", **selection: Any) -> Batch:
        return batches.batch_create(action=action, by=self.charlie, runs=Run.objects.all(),
                                    **selection)

    def test_it_freezes_a_filter_into_the_runs_it_matched_newest_first(self) -> None:
        with self.captureOnCommitCallbacks() as queued:
            batch = self.create(filters={"status": "failed", "agent": "checkout"})
        Run.objects.create(agent="checkout", status=Run.Status.FAILED)  # too late for it

        assert len(queued) == 1  # its task, once the batch is committed
        assert list(batch.items.order_by("position").values_list(
            "run_id", "status_before", "outcome")) == [
            (r.pk, "failed", "pending") for r in (self.f3, self.f2, self.f1)]
        assert (batch.action, batch.status, batch.actor) == ("compensate", "running", "charlie")
        assert batch.selection == {"filter": {"status": "failed", "agent": "checkout"}}
        event = AuditEvent.objects.get(action="batch.created")
        assert (event.run, event.actor) == (None, "charlie")
        assert event.data == {"batch": str(batch.code), "action": "compensate", "runs": 3,
                              "filter": {"status": "failed", "agent": "checkout"}}

    def test_it_acts_on_each_run_once_through_the_services_with_the_batch_in_its_audit(
            self) -> None:
        batch = batches.batch_create(action="compensate", runs=Run.objects.all(),
                                     by=services.Actor(self.charlie, "key sg_1a2b3c4d"),
                                     codes=[self.f1.code, self.f2.code, self.f1.code],
                                     reason="outage")
        with self.captureOnCommitCallbacks():
            process(batch)
            process(batch)  # a duplicate delivery, or the sweeper: nothing more

        batch.refresh_from_db()
        assert (batch.status, batch.lease_owner) == ("done", "")
        assert batch.finished_at is not None
        assert outcomes(batch) == [(self.f1.code, "done", ""), (self.f2.code, "done", "")]
        assert batches.batch_counts(batch=batch) == {
            "pending": 0, "done": 2, "skipped": 0, "failed": 0, "total": 2}
        for run in (self.f1, self.f2):
            run.refresh_from_db()
            assert (run.request["action"], run.request["by"]) == ("compensate", "charlie")
            (event,) = AuditEvent.objects.filter(run=run)
            assert (event.action, event.actor, event.data) == (
                "run.compensate_requested", "charlie",
                {"via": f"key sg_1a2b3c4d, batch {batch.code}", "reason": "outage"})

    def test_it_skips_runs_that_moved_on_or_that_the_action_does_not_fit_and_says_why(
            self) -> None:
        batch = self.create(action="retry",
                            codes=[self.f1.code, self.done.code, self.f2.code, self.f3.code])
        services.run_compensate(run=self.f1, by=self.bob)  # a request waits on it
        Run.objects.filter(pk=self.f2.pk).update(status=Run.Status.SUCCEEDED)  # retried by hand
        process(batch)

        assert outcomes(batch) == [
            (self.f1.code, "skipped", f"run {self.f1.code} has a request waiting for a worker "
                                      "(compensate by bob); try again once it is carried out"),
            (self.done.code, "skipped", f"run {self.done.code} is succeeded; only a failed run, "
                                        "or one held past its pivot, is retried"),
            (self.f2.code, "skipped", f"run {self.f2.code} moved on: it was failed when the "
                                      "batch was made, and is succeeded now"),
            (self.f3.code, "done", "")]
        assert not AuditEvent.objects.filter(run__in=[self.f1, self.f2, self.done],
                                             action="run.retry_requested").exists()

    def test_it_retries_the_failed_compensations_of_runs_that_have_some(self) -> None:
        batch = self.create(action="retry_compensations",
                            codes=[self.stuck.code, self.parked.code, self.f1.code])
        process(batch)

        assert outcomes(batch) == [
            (self.stuck.code, "done", ""),
            (self.parked.code, "skipped",
             f"run {self.parked.code} has no failed compensation to retry"),
            (self.f1.code, "skipped", f"run {self.f1.code} is failed; only a run that needs "
                                      "attention, or whose compensation waits, has one to "
                                      "retry")]
        self.stuck.refresh_from_db()
        assert self.stuck.request["action"] == "compensate"  # retries every failed one

    def test_it_skips_the_runs_its_author_may_no_longer_act_on(self) -> None:
        batch = self.create(codes=[self.f1.code, self.f2.code])
        self.charlie.groups.clear()  # no longer an operator
        process(batch)

        assert [o[1:] for o in outcomes(batch)] == [
            ("skipped", f"charlie may no longer act on run {r.code}") for r in (self.f1, self.f2)]
        assert not AuditEvent.objects.filter(run__isnull=False).exists()

    def test_it_records_an_unexpected_error_and_goes_on(self) -> None:
        batch = self.create(codes=[self.f1.code, self.f2.code])
        real = services.run_compensate

        def broken(*, run: Run, **kwargs: Any) -> Run:
            if run.pk == self.f1.pk:
                raise RuntimeError("disk full")
            return real(run=run, **kwargs)

        with mock.patch.object(services, "run_compensate", broken):
            process(batch)

        assert outcomes(batch) == [(self.f1.code, "failed", "RuntimeError: disk full"),
                                   (self.f2.code, "done", "")]
        assert batches.batch_counts(batch=batch)["failed"] == 1

    def test_it_cancels_the_runs_not_reached_yet_and_stops(self) -> None:
        batch = self.create(codes=[self.f1.code, self.f2.code, self.f3.code])
        assert batch_worker.batch_process(batch_pk=batch.pk, owner="w1", budget=0)  # one run
        batch = batches.batch_cancel(batch=batch, by=self.bob)

        reason = "the batch was cancelled by bob before this run"
        assert outcomes(batch) == [(self.f1.code, "done", ""),
                                   (self.f2.code, "skipped", reason),
                                   (self.f3.code, "skipped", reason)]
        assert (batch.status, batch.cancelled_by) == ("cancelled", "bob")
        assert not batch_worker.batch_process(batch_pk=batch.pk, owner="w1")
        assert not AuditEvent.objects.filter(run__in=[self.f2, self.f3]).exists()
        assert AuditEvent.objects.get(action="batch.cancelled").data == {
            "batch": str(batch.code)}
        with pytest.raises(services.ActionNotAllowed, match="is cancelled already"):
            batches.batch_cancel(batch=batch, by=self.bob)

    def test_it_stops_before_the_next_run_once_cancelled(self) -> None:
        batch = self.create(codes=[self.f1.code, self.f2.code])
        Batch.objects.filter(pk=batch.pk).update(cancel_requested_at=timezone.now(),
                                                 cancelled_by="bob")
        process(batch)
        assert [o[1] for o in outcomes(batch)] == ["skipped", "skipped"]
        assert Batch.objects.get(pk=batch.pk).status == "cancelled"

    def test_it_refuses_a_selection_it_cannot_act_on_and_stores_nothing(self) -> None:
        unknown = uuid.uuid4()
        cases: list[tuple[dict[str, Any], str, list[Any]]] = [
            ({"codes": []}, "the selection is empty", [["runs"]]),
            ({"codes": [self.f1.code, unknown]}, f"no run {unknown}", [["runs", 1]]),
            ({"codes": [self.f1.code], "filters": {}}, "one of the two", [["runs"]]),
            ({}, "one of the two", [["runs"]]),
            ({"filters": {"status": "compensated"}}, "no run matches", [["filter"]]),
            ({"filters": {"colour": "red"}}, "unknown filter", [["filter", "colour"]]),
            ({"filters": {}, "action": "delete"}, "unknown action", [["action"]]),
        ]
        with override_settings(STATEGUARD_BATCH_MAX_RUNS=2):
            cases.append(({"filters": {"status": "failed"}},
                          "the filter matches 3 runs; a batch takes at most 2", [["filter"]]))
            cases.append(({"codes": [self.f1.code, self.f2.code, self.f3.code]},
                          "3 runs selected; a batch takes at most 2", [["runs"]]))
            for selection, message, locs in cases:
                with self.subTest(selection=selection), \
                        pytest.raises(batches.BatchRefused, match=message) as refused:
                    action = selection.pop("action", "compensate")
                    self.create(action=action, **selection)
                assert [e["loc"] for e in refused.value.errors] == locs
        assert not Batch.objects.exists() and not AuditEvent.objects.exists()

    def test_it_previews_how_many_runs_of_which_statuses_it_would_touch(self) -> None:
        services.run_retry(run=self.f1, by=self.bob)  # waits for a worker: not eligible now
        preview = batches.batch_preview(action="compensate", runs=Run.objects.all(),
                                        filters={"agent": "checkout"})
        assert preview == {"action": "compensate", "count": 5, "eligible": 4,
                           "statuses": {"failed": 3, "succeeded": 1, "needs_attention": 1},
                           "runs": [str(r.code) for r in (self.stuck, self.done, self.f3,
                                                          self.f2, self.f1)]}
        assert not Batch.objects.exists()

    def test_it_leaves_a_batch_to_the_worker_that_holds_it_until_its_lease_expires(
            self) -> None:
        batch = self.create(codes=[self.f1.code])
        Batch.objects.filter(pk=batch.pk).update(
            lease_owner="w1", lease_expires_at=timezone.now() + timedelta(seconds=5))
        assert not batch_worker.batch_process(batch_pk=batch.pk, owner="w2")
        assert outcomes(batch)[0][1] == "pending"

        Batch.objects.filter(pk=batch.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))  # w1 died
        process(batch, owner="w2")
        assert outcomes(batch)[0][1] == "done"

    def test_it_judges_a_batchs_lease_by_the_database_clock(self) -> None:
        batch = self.create(codes=[self.f1.code])
        Batch.objects.filter(pk=batch.pk).update(
            lease_owner="w1", lease_expires_at=db_now() + timedelta(seconds=5))
        with time_machine.travel(time.time() + 30, tick=True), \
                mock.patch.object(batch_tasks.batch_process, "apply_async") as queued:
            # A worker and a sweeper whose clocks are 30 s ahead: w1's lease still runs.
            assert not batch_worker.batch_process(batch_pk=batch.pk, owner="w2")
            assert batch_tasks.batch_sweep() == 0
        queued.assert_not_called()
        assert outcomes(batch)[0][1] == "pending"

    def test_the_sweeper_hands_a_stalled_batch_to_a_worker_once_per_lease(self) -> None:
        batch = self.create(codes=[self.f1.code])
        now = timezone.now()
        assert batch_worker.batch_stalled(now) == []  # new: its own message is on its way
        later = now + timedelta(seconds=11)  # a lease (10 s) later, never taken up
        assert batch_worker.batch_stalled(later) == [batch.pk]
        assert batch_worker.batch_stalled(later) == []  # handed over: not again this lease
        assert batch_worker.batch_stalled(later + timedelta(seconds=11)) == [batch.pk]
        process(batch)
        assert batch_worker.batch_stalled(later + timedelta(seconds=60)) == []  # finished

    def test_the_beats_batch_sweep_queues_each_stalled_batch_with_an_expiry(self) -> None:
        batch = self.create(codes=[self.f1.code])
        Batch.objects.filter(pk=batch.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1))  # its worker died
        with mock.patch.object(batch_tasks.batch_process, "apply_async") as queued:
            assert batch_tasks.batch_sweep() == 1
            assert batch_tasks.batch_sweep() == 0  # handed over: not again this lease
        queued.assert_called_once_with((batch.pk,), expires=5 * 2)  # STATEGUARD_SWEEP_SECONDS


@pytest.mark.django_db(transaction=True)
def test_two_workers_on_one_batch_do_each_run_once() -> None:
    charlie = make_user("charlie", "operator")
    runs = [Run.objects.create(agent="checkout", status=Run.Status.FAILED) for _ in range(4)]
    batch = batches.batch_create(action="retry", by=charlie, runs=Run.objects.all(),
                                 codes=[r.code for r in runs])
    first = batch.items.get(position=0)
    holding, release = threading.Event(), threading.Event()

    def another_worker_on_the_first_run() -> None:  # holds its item's row lock meanwhile
        try:
            with transaction.atomic():
                BatchItem.objects.select_for_update().get(pk=first.pk)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    other = threading.Thread(target=another_worker_on_the_first_run)
    other.start()
    assert holding.wait(10)
    process(batch, owner="w2")  # skips the locked item, does the rest, does not finish
    assert outcomes(batch)[0][1] == "pending" and Batch.objects.get(pk=batch.pk).finished_at is None
    assert [o[1] for o in outcomes(batch)[1:]] == ["done"] * 3
    release.set()
    other.join()

    Batch.objects.filter(pk=batch.pk).update(lease_owner="")  # w2's task queued again
    process(batch, owner="w2")
    assert [o[1] for o in outcomes(batch)] == ["done"] * 4
    assert Batch.objects.get(pk=batch.pk).status == "done"
    for run in runs:
        assert AuditEvent.objects.filter(run=run, action="run.retry_requested").count() == 1
