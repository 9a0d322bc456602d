"""A batch whose worker is SIGKILLed mid-batch, in the middle of a run's item: a real Celery
worker, killed while its transaction for the ninth run waits on that run's row lock (held by
this test, so the kill lands at a known point), and another worker that the sweeper hands the
batch to. Every run is compensated by the batch exactly once: the eight done before the kill
are not done again, the ninth (rolled back with the worker's transaction) is done by the next
worker, and so are the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import stripe
from django.db import connection, transaction

from stateguard_web.batches import services as batches
from stateguard_web.sagas.models import AuditEvent, Batch, BatchItem, Compensation, Run
from tests.web.api.world import make_user
from tests.web.batch_world import failed_checkouts
from tests.web.conftest import Workers, wait_for


def done(batch: Batch) -> list[int]:
    return sorted(BatchItem.objects.filter(batch=batch, outcome=BatchItem.Outcome.DONE)
                  .values_list("position", flat=True))


def worker_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                       "'stateguard-worker' AND wait_event_type = 'Lock' "
                       "AND datname = current_database()")  # not other suites' workers
        return bool(cursor.fetchone()[0])


def test_it_does_no_item_twice_when_its_worker_is_killed_mid_batch(
        workers: Workers, sandbox: Path, settings: Any, stripe_client: stripe.StripeClient,
        localstripe_url: str) -> None:
    charlie = make_user("charlie", "operator")
    runs = failed_checkouts(settings, localstripe_url, 20, charlie)
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY="sk_test_stateguard")
    batch = batches.batch_create(action="compensate", by=charlie, runs=Run.objects.all(),
                                 filters={"status": "failed"})
    ninth = batch.items.get(position=8)

    with transaction.atomic():  # the ninth run's row lock: the worker's item waits on it
        Run.objects.select_for_update().get(pk=ninth.run_id)
        w1 = workers.start("w1")
        wait_for(lambda: done(batch) == list(range(8)) and worker_waits_for_a_lock(), 60,
                 "the worker to be mid-way through the ninth run", workers.logs)
        workers.kill(w1)
    assert done(batch) == list(range(8))
    assert not AuditEvent.objects.filter(run_id=ninth.run_id,
                                         action="run.compensate_requested").exists()

    workers.start("w2", beat=True)  # its sweeper finds the batch whose worker died
    wait_for(lambda: Batch.objects.filter(pk=batch.pk, finished_at__isnull=False).exists()
             and not Run.objects.filter(request__isnull=False).exists(), 90,
             "the batch and its requests to be carried out", workers.logs)

    batch.refresh_from_db()
    assert batch.status == Batch.Status.DONE and done(batch) == list(range(20))
    assert "batches handed to a worker again" in workers.logs()
    for run in runs:
        run.refresh_from_db()
        requests = AuditEvent.objects.filter(run=run, action="run.compensate_requested")
        assert [(e.actor, e.data) for e in requests] == [
            ("charlie", {"via": f"batch {batch.code}"})]
        assert run.status == Run.Status.COMPENSATED
        (compensation,) = Compensation.objects.filter(run=run)
        assert compensation.attempts.count() == 1
