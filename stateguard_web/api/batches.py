"""/api/batches: one action over many runs (retry, compensate, retry failed compensations).

A batch is made at once (its selection frozen into runs) and carried out by a worker, run by
run, through the same services as a single action (``batches/services.py``): 202 with the batch,
whose ``counts`` and ``items`` say how far it is. ``dry_run`` says what it would touch.
"""

from __future__ import annotations

import uuid

from django.http import HttpRequest
from ninja import Router, Status

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import BatchIn, BatchOut, BatchPreviewOut
from stateguard_web.batches import services as batches
from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Batch

router = Router(tags=["batches"])


@router.post("", response={200: BatchPreviewOut, 202: BatchOut, **errors(400, 422)},
             summary="Act on many runs")
def create_batch(request: HttpRequest, data: BatchIn) -> Status[dict[str, object]]:
    """Retry, compensate, or retry the failed compensations of the runs named, or of every
    run the filter matches now (at most ``STATEGUARD_BATCH_MAX_RUNS``). 202: a worker goes
    through them one by one; a run that moved on meanwhile, or that the action does not fit,
    is skipped with the reason. With ``dry_run``, 200 with how many runs of which statuses it
    would touch, and nothing stored."""
    who = principal(request)
    access.check(who.user, Ability.OPERATE)
    runs = access.visible_runs(who.user)
    filters = data.filter.model_dump(exclude_none=True) if data.filter is not None else None
    if data.dry_run:
        return Status(200, batches.batch_preview(action=data.action, runs=runs,
                                                 codes=data.runs, filters=filters))
    batch = batches.batch_create(action=data.action, by=who.actor, runs=runs, codes=data.runs,
                                 filters=filters, reason=data.reason)
    return Status(202, batches.batch_detail(batch=batch))


def _batch(request: HttpRequest, code: uuid.UUID, ability: Ability) -> Batch:
    """The batch, for a caller that may read every run (a batch is about everyone's runs): 403
    for a caller with no such role, 404 for a submitter (as if it did not exist)."""
    who = principal(request)
    access.check(who.user, ability)
    if not access.reads_all_runs(who.user):
        raise selectors.NotFound(f"no batch {code}")
    return batches.batch_get(code=code)


@router.get("/{code}", response={200: BatchOut, **errors(404, 422)}, summary="Read a batch")
def get_batch(request: HttpRequest, code: uuid.UUID) -> dict[str, object]:
    """The batch with its counts (pending, done, skipped, failed) and every run's outcome."""
    return batches.batch_detail(batch=_batch(request, code, Ability.VIEW))


@router.post("/{code}/cancel", response={200: BatchOut, **errors(404, 409, 422)},
             summary="Cancel a batch")
def cancel_batch(request: HttpRequest, code: uuid.UUID) -> dict[str, object]:
    """Skip every run not reached yet (the one being acted on, if any, is finished); 409 if
    the batch is finished."""
    batch = _batch(request, code, Ability.OPERATE)
    return batches.batch_detail(batch=batches.batch_cancel(batch=batch,
                                                           by=principal(request).actor))
