"""/api/runs: submit, list and read runs, and the operator's actions on one.

Actions are requests that a worker carries out (one at a time per run): they answer 202 with
the run, whose ``request`` shows what waits. Resolving by hand is done at once (200), and so is
terminating a pending run no worker took.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Header, Query, Router, Status
from ninja.errors import ValidationError
from pydantic import ValidationError as PydanticError

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api import event_stream
from stateguard_web.api.auth import principal, recheck
from stateguard_web.api.common import errors, run_for
from stateguard_web.api.errors import JsonParser
from stateguard_web.api.schemas import (
    CompensateIn,
    DecisionIn,
    EventId,
    EventOut,
    IdempotencyKey,
    ResolveIn,
    RetryIn,
    RunDetailOut,
    RunFilter,
    RunIn,
    RunListOut,
    RunOut,
    RunWebhooksOut,
    TerminateIn,
    TimelineOut,
)
from stateguard_web.runs import selectors, services, timeline
from stateguard_web.runs.filters import RunFilterForm
from stateguard_web.runs.journal_events import BadEventId, Cursor
from stateguard_web.sagas.models import Approval, Run
from stateguard_web.webhooks import selectors as webhooks
from stateguard_web.webhooks import services as webhook_services

router = Router(tags=["runs"])
Response = Status[dict[str, object]]


@router.post("", response={200: RunOut, 201: RunOut, **errors(400, 422)},
             summary="Submit a run")
def submit_run(request: HttpRequest, data: RunIn,
               idempotency_key: Annotated[IdempotencyKey | None,
                                          Header(alias="Idempotency-Key")] = None) -> Response:
    """201 with the new run; 200 with the same run when this user sent this idempotency key
    before with the same agent and input (a different submission with it is a 422)."""
    who = principal(request)
    access.check(who.user, Ability.SUBMIT)
    if idempotency_key and data.idempotency_key and idempotency_key != data.idempotency_key:
        raise ValidationError([{"loc": ("header", "Idempotency-Key"),
                                "msg": "differs from the body's idempotency_key"}])
    run = webhook_services.run_submit(
        agent=data.agent, input=data.input, by=who.actor,
        idempotency_key=idempotency_key or data.idempotency_key or "", key=who.key,
        webhook_url=data.webhook_url)
    return Status(200 if run.replayed else 201, selectors.run_summary(run=run))


@router.get("", response={200: RunListOut, **errors(422)}, summary="List runs")
def list_runs(request: HttpRequest, filters: Query[RunFilter]) -> dict[str, object]:
    """The runs the caller may see (a submitter: its own), newest first or in the order
    `sort` names: the dashboard's runs list, whose query string this takes as it is (the
    list's page, `after`, `before` and `tz` of its "between…" range included)."""
    who = principal(request)
    access.check(who.user, Ability.VIEW)
    form = RunFilterForm(request.GET)  # the schema documents these; the list's parser reads
    if form.problems():
        raise ValidationError([{"loc": ("query", name), "msg": " ".join(messages)}
                               for name, messages in form.errors.items()])
    query = form.filters()
    query.pop("page")
    runs = selectors.run_list(runs=access.visible_runs(who.user), **query)
    page = runs[filters.offset:filters.offset + filters.limit]
    return {"items": [selectors.run_summary(run=run) for run in page], "count": runs.count()}


@router.get("/{code}", response={200: RunDetailOut, **errors(404, 422)}, summary="Read a run")
def get_run(request: HttpRequest, code: uuid.UUID) -> dict[str, object]:
    """The run with its steps, compensations (every attempt), approvals, the violated
    invariant if any, and its audit trail."""
    _, run = run_for(request, code, Ability.VIEW, detail=True)
    return selectors.run_detail(run=run)


@router.get("/{code}/webhooks", response={200: RunWebhooksOut, **errors(404, 422)},
            summary="Read a run's webhook deliveries")
def get_run_webhooks(request: HttpRequest, code: uuid.UUID) -> dict[str, object]:
    """Each event sent (or to send) to the run's webhook URL, with every attempt and what the
    receiver answered."""
    _, run = run_for(request, code, Ability.VIEW)
    return webhooks.run_webhooks(run=run)


@router.get("/{code}/timeline", response={200: TimelineOut, **errors(404, 422)},
            summary="Read a run's timeline")
def get_run_timeline(request: HttpRequest, code: uuid.UUID) -> dict[str, object]:
    """Where the run's time went and what ran at once, as the run page draws it: a bar per
    step, tool call, model's turn, approval's wait and compensation (with its attempts), each
    in a lane of its group, from the journal's times."""
    _, run = run_for(request, code, Ability.VIEW)
    return timeline.as_data(timeline.read(run=run, now=timezone.now()), run)


_EVENTS_DOC = {"responses": {
    200: {"description": "the run's events as Server-Sent Events (text/event-stream): each "
                         "`id: <cursor>`, `event: <type>`, `data: <JSON event>`; under "
                         "Daphne the stream lasts until the run stops, under gunicorn it "
                         "is what there is now, with `retry` (docs/api.md)",
          "content": {event_stream.CONTENT_TYPE: {"schema": EventOut.sse_schema()}}},
    204: {"description": "the run stopped and the client has every event: stop reconnecting"},
}}


@router.get("/{code}/events", response=errors(404, 422), summary="Follow a run's events",
            openapi_extra=_EVENTS_DOC)
def run_events(request: HttpRequest, code: uuid.UUID,
               last_event_id: Annotated[EventId | None, Header(alias="Last-Event-ID")] = None
               ) -> HttpResponse:
    """The run's step, approval, compensation and status changes, as the dashboard's
    websocket sends them, as Server-Sent Events, until the run stops (succeeded, compensated,
    failed, needs_attention). With the `Last-Event-ID` of the last event read, only what came
    after it: what the client missed, from the journal, then the rest."""
    _, run = run_for(request, code, Ability.VIEW)
    try:
        cursor = Cursor.parse(last_event_id) if last_event_id else Cursor()
    except BadEventId as exc:
        raise ValidationError([{"loc": ("header", "Last-Event-ID"), "msg": str(exc)}]) from None
    user = recheck(request)

    def allowed() -> bool:  # the caller may still see the run (asked on each heartbeat)
        now = Run.objects.filter(pk=run.pk).first()
        return now is not None and access.may(user(), Ability.VIEW, now)

    return event_stream.respond(request, run, cursor, allowed)


def _decide(request: HttpRequest, code: uuid.UUID, data: DecisionIn,
            decide: Callable[..., Run]) -> Response:
    """Carry out ``decide`` (approve or reject) on the approval the operator named, which must
    still be pending (else 409: the operator saw another state than the one there is now)."""
    who, run = run_for(request, code, Ability.OPERATE)
    approval = selectors.approval_get(run=run, pk=data.approval)
    if approval.status != Approval.Status.PENDING:
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        raise services.ActionNotAllowed(f"approval {approval.pk} of {approval.node!r} is no "
                                        f"longer pending: it was {approval.status}{by}")
    run = decide(run=run, by=who.actor, step_id=approval.step_id, reason=data.reason)
    return Status(202, selectors.run_summary(run=run))


ACTION = {202: RunOut, **errors(400, 404, 409, 422)}


@router.post("/{code}/approve", response=ACTION, summary="Approve a gated step")
def approve_run(request: HttpRequest, code: uuid.UUID, data: DecisionIn) -> Response:
    """Decide the approval (it must still be pending: else 409); a worker runs the step."""
    return _decide(request, code, data, services.run_approve)


@router.post("/{code}/reject", response=ACTION, summary="Reject a gated step")
def reject_run(request: HttpRequest, code: uuid.UUID, data: DecisionIn) -> Response:
    """Decide the approval (it must still be pending: else 409); a worker unwinds the run."""
    return _decide(request, code, data, services.run_reject)


def _retry_body(request: HttpRequest) -> RetryIn | None:
    """The retry's optional JSON body. A POST with none, or with a form's (an empty one, as
    ``curl -X POST`` or a form sends it), is a plain retry: the body is read only when it is
    JSON (CSRF's check of a session reads a form's body first: it cannot be read again)."""
    if request.content_type != "application/json" or not request.body:
        return None
    data = JsonParser().parse_body(request)
    try:
        return RetryIn.model_validate(data)
    except PydanticError as exc:
        raise ValidationError([{**e, "loc": ("body", "data", *e["loc"])}
                               for e in exc.errors(include_url=False)]) from None


@router.post("/{code}/retry", response=ACTION, summary="Retry a failed run",
             openapi_extra={"requestBody": {"required": False, "content": {
                 "application/json": {"schema": RetryIn.model_json_schema()}}}})
def retry_run(request: HttpRequest, code: uuid.UUID) -> Response:
    """Resume a failed run from where it failed (never from the start). With ``from_step``,
    retry from that earlier step: it and the steps after it are undone first (newest first),
    then the run goes on from before it, with ``update`` applied to its state; 422 for a step
    the run does not have, 409 when the run's state (or a pivot in between) refuses it."""
    who, run = run_for(request, code, Ability.OPERATE)
    data = _retry_body(request)
    run = services.run_retry(run=run, by=who.actor, from_step=data.from_step if data else None,
                             update=data.update if data else None)
    return Status(202, selectors.run_summary(run=run))


@router.post("/{code}/compensate", response=ACTION, summary="Compensate a run")
def compensate_run(request: HttpRequest, code: uuid.UUID,
                   data: CompensateIn | None = None) -> Response:
    """Undo what the run did, newest first; on a run that needs attention, retry the
    compensations that failed. The body (a reason) is optional."""
    who, run = run_for(request, code, Ability.OPERATE)
    run = services.run_compensate(run=run, by=who.actor, reason=data.reason if data else "")
    return Status(202, selectors.run_summary(run=run))


@router.post("/{code}/terminate", response={200: RunOut, **ACTION},
             summary="Terminate a running run")
def terminate_run(request: HttpRequest, code: uuid.UUID, data: TerminateIn) -> Response:
    """Stop a pending or running run now, then unwind it (``"then": "unwind"``) or hold it
    ``needs_attention`` (``"hold"``). 202: the worker running it stops at its next step
    boundary (``request`` shows the terminate until then); 200: a pending run no worker took
    is settled at once (nothing ran). 409 for a run in another status, with a request
    waiting, or past its pivot to unwind (hold it instead)."""
    who, run = run_for(request, code, Ability.OPERATE)
    run = services.run_terminate(run=run, by=who.actor, then=data.then, reason=data.reason)
    waits = run.status in (Run.Status.PENDING, Run.Status.RUNNING)  # for a worker
    return Status(202 if waits else 200, selectors.run_summary(run=run))


@router.post("/{code}/resolve", response={200: RunOut, **errors(400, 404, 409, 422)},
             summary="Resolve a run by hand")
def resolve_run(request: HttpRequest, code: uuid.UUID, data: ResolveIn) -> dict[str, object]:
    """Mark a run that needs attention compensated: an operator undid by hand what the
    compensations could not (the note says what)."""
    who, run = run_for(request, code, Ability.OPERATE)
    return selectors.run_summary(
        run=services.run_resolve_by_hand(run=run, by=who.actor, note=data.note))
