"""Batches, the worker's side: carry out a batch's items one at a time (``batch_process``,
called by ``tasks.batch_process``), and find the batches whose worker died (``batch_stalled``,
for the sweep). How a batch is made, and why each item is done exactly once: ``services``.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Count, Exists, OuterRef, Q, Value, When
from django.utils import timezone

from stateguard import lifecycle
from stateguard.lifecycle import Action
from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.runs import services
from stateguard_web.sagas import events
from stateguard_web.sagas.journal.leases import db_now
from stateguard_web.sagas.models import Batch, BatchItem, Compensation, Run

logger = logging.getLogger("stateguard.batches")

Outcome = BatchItem.Outcome
# What the state machine is asked about each run, per batch action. "Retry failed
# compensations" asks RETRY_COMPENSATION (a run that needs attention) and is carried out as a
# compensate request, which on such a run retries every compensation that failed.
CHECKS = {Batch.Action.RETRY: Action.RETRY, Batch.Action.COMPENSATE: Action.COMPENSATE,
          Batch.Action.RETRY_COMPENSATIONS: Action.RETRY_COMPENSATION}
SLICE_SECONDS = 2.0  # then the batch goes to the back of the queue: see tasks.batch_process


def skip_pending(batch: Batch) -> None:
    """Skip the pending items no worker is carrying out right now (their row is not locked)."""
    pending = list(BatchItem.objects.select_for_update(skip_locked=True)
                   .filter(batch=batch, outcome=Outcome.PENDING).values_list("pk", flat=True))
    BatchItem.objects.filter(pk__in=pending).update(
        outcome=Outcome.SKIPPED, finished_at=timezone.now(),
        reason=f"the batch was cancelled by {batch.cancelled_by} before this run")
    if pending:
        _progress(batch, "batch.progress")


def finish(batch: Batch) -> bool:
    """Mark the batch done (or cancelled) if no item is pending; whether this call did."""
    pending = BatchItem.objects.filter(batch=OuterRef("pk"), outcome=Outcome.PENDING)
    finished = Batch.objects.filter(pk=batch.pk, finished_at__isnull=True).exclude(
        Exists(pending)).update(
        status=Case(When(cancel_requested_at__isnull=False, then=Value(Batch.Status.CANCELLED)),
                    default=Value(Batch.Status.DONE)),
        finished_at=timezone.now(), lease_owner="", lease_expires_at=None)
    if finished:
        _progress(batch, "batch.finished")
    return bool(finished)


def batch_counts(*, batch: Batch) -> dict[str, int]:
    """How many items are pending, done, skipped and failed, and in all."""
    rows = dict(batch.items.order_by().values_list("outcome").annotate(n=Count("pk")))
    counts = {outcome: rows.get(outcome, 0) for outcome in Outcome.values}
    return {**counts, "total": sum(counts.values())}


def _progress(batch: Batch, type: str, **data: Any) -> None:
    """Tell the batch's page (after commit), with the counts as this transaction sees them."""
    status = Batch.objects.filter(pk=batch.pk).values_list("status", flat=True).first()
    events.publish_batch(batch.code, type, status=status, counts=batch_counts(batch=batch),
                         **data)


def _lease(pk: int, owner: str, now: datetime) -> bool:
    """Take (or renew) the batch's lease: free, handed to the queue (no owner), ours, or
    expired (its worker died)."""
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    return bool(Batch.objects.filter(
        Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__lt=now),
        pk=pk, finished_at__isnull=True,
    ).update(lease_owner=owner, lease_expires_at=now + lease))


def batch_process(*, batch_pk: int, owner: str, budget: float = SLICE_SECONDS) -> bool:
    """Carry out the batch's pending items in order, one transaction each, for about
    ``budget`` seconds. True if items remain: the lease is handed back to the queue (no
    owner) and the caller queues the batch again; a worker that dies holding it leaves it to
    the sweeper once the lease expires."""
    deadline = time.monotonic() + budget
    if not _lease(batch_pk, owner, db_now()):  # by the database's clock, never this host's
        logger.info("batch %s: another worker holds it, or it is finished", batch_pk)
        return False
    while True:
        batch = Batch.objects.select_related("created_by").get(pk=batch_pk)
        if batch.finished_at is not None:
            return False
        if batch.cancel_requested_at is not None:
            with transaction.atomic():
                skip_pending(batch)
                finish(batch)
            return False
        if not _next(batch):
            with transaction.atomic():
                finish(batch)  # not if another worker is on the last items: it finishes
            return False
        if time.monotonic() > deadline:  # at least one item per slice
            Batch.objects.filter(pk=batch_pk, lease_owner=owner).update(lease_owner="")
            return True
        _lease(batch_pk, owner, db_now())


@transaction.atomic
def _next(batch: Batch) -> bool:
    """Carry out the next pending item: its action and its outcome commit together. False
    when no pending item is free (none left, or the last ones are another worker's)."""
    item = (BatchItem.objects.select_for_update(skip_locked=True)
            .filter(batch=batch, outcome=Outcome.PENDING).order_by("position").first())
    if item is None:
        return False
    item.outcome, item.reason = _carry_out(batch, item)
    item.finished_at = timezone.now()
    item.save(update_fields=["outcome", "reason", "finished_at"])
    _progress(batch, "batch.progress", item={
        "run": str(item.run_code), "position": item.position, "outcome": item.outcome,
        "reason": item.reason})
    return True


def _carry_out(batch: Batch, item: BatchItem) -> tuple[str, str]:
    """The item's outcome and why: the run is checked under its row lock, as it is now."""
    run = Run.objects.select_for_update().filter(pk=item.run_id).first() if item.run_id else None
    if run is None:
        return Outcome.SKIPPED, f"run {item.run_code} was deleted"
    user = batch.created_by
    if not access.may(user, Ability.OPERATE, run):
        return Outcome.SKIPPED, f"{batch.actor} may no longer act on run {run.code}"
    if run.status != item.status_before:
        return Outcome.SKIPPED, (f"run {run.code} moved on: it was {item.status_before} when "
                                 f"the batch was made, and is {run.status} now")
    why = lifecycle.refusal(CHECKS[Batch.Action(batch.action)], run.status, run=str(run.code),
                            waiting=run.waiting_request)
    if why is not None:
        return Outcome.SKIPPED, why
    if batch.action == Batch.Action.RETRY_COMPENSATIONS and not run.compensations.filter(
            status__in=[Compensation.Status.FAILED,
                        Compensation.Status.SKIPPED_IN_DOUBT]).exists():
        return Outcome.SKIPPED, f"run {run.code} has no failed compensation to retry"
    assert user is not None  # access.may refuses a missing user
    by = services.Actor(user, via=", ".join(filter(None, [batch.via, f"batch {batch.code}"])))
    try:
        if batch.action == Batch.Action.RETRY:
            services.run_retry(run=run, by=by)
        else:
            services.run_compensate(run=run, by=by, reason=batch.reason)
    except services.ActionNotAllowed as exc:
        return Outcome.SKIPPED, str(exc)
    except Exception as exc:  # the service's savepoint rolled back; the batch goes on
        logger.exception("batch %s: %s of run %s failed", batch.code, batch.action, run.code)
        return Outcome.FAILED, f"{type(exc).__name__}: {exc}"[:2000]
    return Outcome.DONE, ""


def batch_stalled(now: datetime) -> list[int]:
    """Batches no worker is going through: their worker died (its lease expired), or their
    message was lost (never leased, made over a lease ago). Each is handed to the queue for a
    lease period, so that sweeps meanwhile do not queue it again."""
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    with transaction.atomic():
        pks = list(Batch.objects.filter(
            Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True,
                                            created_at__lt=now - lease),
            finished_at__isnull=True,
        ).select_for_update(skip_locked=True).values_list("pk", flat=True))
        Batch.objects.filter(pk__in=pks).update(lease_owner="", lease_expires_at=now + lease)
    return pks
