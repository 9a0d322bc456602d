"""Celery tasks of batches. ``batch_process`` keeps the name it had in
``stateguard_web.sagas.tasks``, so that a batch queued before the move still reaches it."""

from __future__ import annotations

import logging
import uuid

from celery import Task, shared_task

from stateguard_web.batches import worker
from stateguard_web.runs.tasks import sweep_message_expiry
from stateguard_web.sagas.journal.leases import db_now

logger = logging.getLogger("stateguard.tasks")


@shared_task(acks_late=True, bind=True, name="stateguard_web.sagas.tasks.batch_process")
def batch_process(self: Task, batch_pk: int) -> None:
    """Go through a batch's runs one at a time (``worker.batch_process``), for a slice of a few
    seconds; then the batch goes to the back of the queue, so that a batch of a thousand runs
    does not keep this worker from the requests it has just made. Each item is done once,
    whatever hands the batch over again (``acks_late`` redelivery, the sweep)."""
    owner = f"{self.request.hostname or 'local'}:{self.request.id or uuid.uuid4().hex}"
    if worker.batch_process(batch_pk=batch_pk, owner=owner):
        batch_process.delay(batch_pk)


@shared_task(acks_late=True, name="stateguard_web.batches.tasks.batch_sweep")
def batch_sweep() -> int:
    """Hand to another worker the batches whose worker died, or whose message was lost
    (beat, every ``STATEGUARD_SWEEP_SECONDS``)."""
    stalled = worker.batch_stalled(db_now())  # leases are judged by the database's clock
    for pk in stalled:
        batch_process.apply_async((pk,), expires=sweep_message_expiry())
    if stalled:
        logger.info("sweep: %d batches handed to a worker again %s", len(stalled), stalled)
    return len(stalled)
