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
worker (``worker.batch_stalled``). Cancelling skips every pending item at once, and the worker
checks for it before each item. Progress goes live to ``events.batch_group(code)``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from stateguard import lifecycle
from stateguard_web.batches import tasks, worker
from stateguard_web.batches.worker import CHECKS, batch_counts
from stateguard_web.runs import selectors, services
from stateguard_web.sagas.models import AuditEvent, Batch, BatchItem, Run

FILTERS = ("status", "agent", "q", "created_after", "created_before", "node",  # run_list's
           "what", "step", "error_type")


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
    worker.skip_pending(batch)
    worker.finish(batch)
    batch.refresh_from_db()
    return batch


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
