"""Batches: one operator action over many runs (retry, compensate, retry failed compensations).

An outage strands a fleet of runs, not one. ``batch_create`` freezes the selection (explicit
runs, or the runs a filter of the runs list matches now) into one ``BatchItem`` per run, in
one transaction, and queues ``tasks.batch_process``. The worker goes through the items in
order, one transaction each, through the same services as a single action
(``services.run_retry``, ``services.run_compensate``): each run is checked under its row lock,
acted on and audited on its own (the audit event's ``via`` names the batch), and a run that
moved on is skipped with the reason in its item::

    batch = batches.batch_create(action="compensate", by=actor, runs=access.visible_runs(user),
                                 filters={"status": "failed", "agent": "checkout"})
    batches.batch_detail(batch=batch)["counts"]  # {"pending": 50, "done": 0, ...}

Skipped, with the reason, is a run that:
- is no longer in the status it had when it was selected ("it moved on": a failed run that
  was retried and succeeded meanwhile must not be compensated by a batch meant for failed
  runs), or that the state machine refuses (``stateguard.lifecycle``: the words an operator
  gets for a single action, such as a request still waiting for a worker);
- the batch's author may no longer act on (its role changed since: ``accounts.access`` is
  asked again, per run, when the worker acts, since that is when it matters);
- for "retry failed compensations", has no failed compensation to retry.

Exactly once per item, through crashes: an item's action, its audit event and its outcome
commit together, and the worker takes only a pending item, under the item's row lock (``FOR
UPDATE SKIP LOCKED``), so a worker killed mid-item leaves it pending (rolled back) and a second
worker on the same batch (a redelivery, the sweeper) never acts on an item twice. A lease on
the batch, renewed after each item, lets the sweeper hand a batch whose worker died to another
worker (``batch_stalled``). Cancelling skips every pending item at once, and the worker checks
for it before each item. Progress goes live to ``events.batch_group(code)``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Case, Count, Exists, OuterRef, Q, QuerySet, Value, When
from django.utils import timezone

from stateguard import lifecycle
from stateguard.lifecycle import Action
from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.sagas import events, selectors, services, tasks
from stateguard_web.sagas.models import AuditEvent, Batch, BatchItem, Compensation, Run

logger = logging.getLogger("stateguard.batches")

Outcome = BatchItem.Outcome
# What the state machine is asked about each run, per batch action. "Retry failed
# compensations" asks RETRY_COMPENSATION (a run that needs attention) and is carried out as a
# compensate request, which on such a run retries every compensation that failed.
CHECKS = {Batch.Action.RETRY: Action.RETRY, Batch.Action.COMPENSATE: Action.COMPENSATE,
          Batch.Action.RETRY_COMPENSATIONS: Action.RETRY_COMPENSATION}
FILTERS = ("status", "agent", "q", "created_after", "created_before")  # selectors.run_list's
SLICE_SECONDS = 2.0  # then the batch goes to the back of the queue: see tasks.batch_process


class BatchRefused(services.ServiceError):
    """The selection cannot make a batch: empty, too large, or naming runs that do not exist
    (the API's 422). ``errors`` name the fields: ``{"loc": ["runs", 3], "msg": ...}``."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


def _action(action: str) -> Batch.Action:
    try:
        return Batch.Action(action)
    except ValueError:
        raise BatchRefused(f"unknown action {action!r}; actions: "
                           f"{', '.join(Batch.Action.values)}",
                           [{"loc": ["action"], "msg": "unknown action"}]) from None


def _user(by: services.Actor | AbstractBaseUser) -> AbstractBaseUser:
    return by.user if isinstance(by, services.Actor) else by


def _selected(runs: QuerySet[Run], codes: list[uuid.UUID] | None,
              filters: dict[str, Any] | None) -> list[tuple[int, uuid.UUID, str, Any]]:
    """``(pk, code, status, request)`` of each run selected, in the order the worker takes
    them: the codes' order, or the runs list's (newest first). ``runs``: those the caller may
    see; the others do not exist for it."""
    if (codes is None) == (filters is None):
        raise BatchRefused("select runs by their codes or by a filter (one of the two)",
                           [{"loc": ["runs"], "msg": "give runs or filter, not both"}])
    limit = settings.STATEGUARD_BATCH_MAX_RUNS
    columns = ("pk", "code", "status", "request")
    if codes is not None:
        codes = list(dict.fromkeys(codes))  # a run named twice is acted on once
        if not codes:
            raise BatchRefused("the selection is empty", [{"loc": ["runs"],
                                                           "msg": "select at least one run"}])
        if len(codes) > limit:
            raise BatchRefused(f"{len(codes)} runs selected; a batch takes at most {limit}",
                               [{"loc": ["runs"], "msg": f"at most {limit} runs"}])
        found = {row[1]: row for row in runs.filter(code__in=codes).values_list(*columns)}
        missing = [i for i, code in enumerate(codes) if code not in found]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise BatchRefused(f"no run {codes[missing[0]]}{more}",
                               [{"loc": ["runs", i], "msg": "no such run"} for i in missing[:20]])
        return [found[code] for code in codes]
    assert filters is not None
    unknown = set(filters) - set(FILTERS)
    if unknown:
        raise BatchRefused(f"unknown filter {sorted(unknown)}; filters: {', '.join(FILTERS)}",
                           [{"loc": ["filter", name], "msg": "unknown filter"}
                            for name in sorted(unknown)])
    matched = selectors.run_list(runs=runs, **filters)
    rows = list(matched.values_list(*columns)[:limit + 1])
    if not rows:
        raise BatchRefused("no run matches the filter",
                           [{"loc": ["filter"], "msg": "matches no run"}])
    if len(rows) > limit:
        raise BatchRefused(f"the filter matches {matched.count()} runs; a batch takes at most "
                           f"{limit}: narrow the filter",
                           [{"loc": ["filter"], "msg": f"matches more than {limit} runs"}])
    return rows


def _waiting(status: str, request: dict[str, Any] | None) -> str | None:
    """``Run.waiting_request`` from the columns alone."""
    return Run(status=status, request=request).waiting_request


def batch_preview(*, action: str, runs: QuerySet[Run], codes: list[uuid.UUID] | None = None,
                  filters: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a batch would touch, for the operator's confirmation: how many runs of which
    statuses, how many the action fits now (the others would be skipped, unless they change
    meanwhile), and which runs (their codes, in order: a batch of exactly these acts on what
    was confirmed). Stores nothing."""
    check = CHECKS[_action(action)]
    rows = _selected(runs, codes, filters)
    eligible = sum(1 for _, _, status, request in rows
                   if lifecycle.refusal(check, status, waiting=_waiting(status, request)) is None)
    return {"action": action, "count": len(rows), "eligible": eligible,
            "statuses": dict(Counter(status for _, _, status, _ in rows).most_common()),
            "runs": [str(code) for _, code, _, _ in rows]}


def _selection(codes: list[uuid.UUID] | None, filters: dict[str, Any] | None) -> dict[str, Any]:
    """What the operator asked for, as JSON (times as ISO 8601)."""
    if codes is not None:
        return {"runs": [str(code) for code in dict.fromkeys(codes)]}
    return {"filter": {k: v.isoformat() if isinstance(v, datetime) else v
                       for k, v in (filters or {}).items() if v is not None}}


@transaction.atomic
def batch_create(*, action: str, by: services.Actor | AbstractBaseUser, runs: QuerySet[Run],
                 codes: list[uuid.UUID] | None = None, filters: dict[str, Any] | None = None,
                 reason: str = "") -> Batch:
    """Freeze the selection into a batch and queue it (once this transaction commits).

    ``runs`` are the runs the author may see (``access.visible_runs``); whether it may act on
    them is the caller's check now and the worker's again per run. ``reason`` goes with each
    compensation request."""
    action = _action(action)
    if not isinstance(reason, str) or "\x00" in reason or len(reason) > 2000:
        raise BatchRefused("the reason must be text of at most 2000 characters, without NUL",
                           [{"loc": ["reason"], "msg": "invalid reason"}])
    rows = _selected(runs, codes, filters)
    user = _user(by)
    via = by.via if isinstance(by, services.Actor) else ""
    batch = Batch.objects.create(action=action, created_by=user, actor=user.get_username(),
                                 via=via, reason=reason,
                                 selection=_selection(codes, filters))
    BatchItem.objects.bulk_create(
        BatchItem(batch=batch, position=i, run_id=pk, run_code=code, status_before=status)
        for i, (pk, code, status, _) in enumerate(rows))
    AuditEvent.objects.create(actor=batch.actor, action="batch.created", data={
        "batch": str(batch.code), "action": action, "runs": len(rows),
        **batch.selection, **({"via": via} if via else {})})
    tasks.batch_process.delay_on_commit(batch.pk)
    return batch


@transaction.atomic
def batch_cancel(*, batch: Batch, by: services.Actor | AbstractBaseUser) -> Batch:
    """Stop the batch: every item still pending is skipped now (the one a worker is carrying
    out, if any, finishes), and the worker stops before the next."""
    batch = Batch.objects.select_for_update().get(pk=batch.pk)
    if batch.finished_at is not None:
        raise services.ActionNotAllowed(f"batch {batch.code} is {batch.status} already")
    actor = _user(by).get_username()
    if batch.cancel_requested_at is None:
        batch.cancel_requested_at, batch.cancelled_by = timezone.now(), actor
        batch.save(update_fields=["cancel_requested_at", "cancelled_by"])
        via = by.via if isinstance(by, services.Actor) else ""
        AuditEvent.objects.create(actor=actor, action="batch.cancelled", data={
            "batch": str(batch.code), **({"via": via} if via else {})})
    _skip_pending(batch)
    _finish(batch)
    batch.refresh_from_db()
    return batch


def _skip_pending(batch: Batch) -> None:
    """Skip the pending items no worker is carrying out right now (their row is not locked)."""
    pending = list(BatchItem.objects.select_for_update(skip_locked=True)
                   .filter(batch=batch, outcome=Outcome.PENDING).values_list("pk", flat=True))
    BatchItem.objects.filter(pk__in=pending).update(
        outcome=Outcome.SKIPPED, finished_at=timezone.now(),
        reason=f"the batch was cancelled by {batch.cancelled_by} before this run")
    if pending:
        _progress(batch, "batch.progress")


def _finish(batch: Batch) -> bool:
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


# -- the worker's side --------------------------------------------------------------------------
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
    if not _lease(batch_pk, owner, timezone.now()):
        logger.info("batch %s: another worker holds it, or it is finished", batch_pk)
        return False
    while True:
        batch = Batch.objects.select_related("created_by").get(pk=batch_pk)
        if batch.finished_at is not None:
            return False
        if batch.cancel_requested_at is not None:
            with transaction.atomic():
                _skip_pending(batch)
                _finish(batch)
            return False
        if not _next(batch):
            with transaction.atomic():
                _finish(batch)  # not if another worker is on the last items: it finishes
            return False
        if time.monotonic() > deadline:  # at least one item per slice
            Batch.objects.filter(pk=batch_pk, lease_owner=owner).update(lease_owner="")
            return True
        _lease(batch_pk, owner, timezone.now())


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


# -- reads --------------------------------------------------------------------------------------
def batch_get(*, code: str | uuid.UUID) -> Batch:
    try:
        return Batch.objects.get(code=uuid.UUID(str(code)))
    except (ValueError, Batch.DoesNotExist):
        raise selectors.NotFound(f"no batch {code}") from None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def batch_detail(*, batch: Batch) -> dict[str, Any]:
    """The batch, its counts and every item in order, as JSON data."""
    return {
        "code": str(batch.code), "action": batch.action, "status": batch.status,
        "created_by": batch.actor, "created_at": batch.created_at.isoformat(),
        "finished_at": _iso(batch.finished_at), "reason": batch.reason,
        "selection": batch.selection,
        "cancel_requested_at": _iso(batch.cancel_requested_at),
        "cancelled_by": batch.cancelled_by or None,
        "counts": batch_counts(batch=batch),
        "items": [{"run": str(i.run_code), "status_before": i.status_before,
                   "outcome": i.outcome, "reason": i.reason,
                   "finished_at": _iso(i.finished_at)}
                  for i in batch.items.order_by("position")],
    }
