"""Writes to the saga journal: submissions and operator actions.

Every service is keyword-only, runs in one transaction, writes an ``AuditEvent`` for what the
operator did, and enqueues its Celery task only once that transaction has committed.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from pydantic import ValidationError

from stateguard import lifecycle, rewind
from stateguard.exceptions import ConfigurationError, InvalidRunState
from stateguard.lifecycle import Action
from stateguard.records import RETRYABLE_COMPENSATIONS
from stateguard.stops import THEN, StopRequest
from stateguard_web.runs import queue, runtime, selectors, tasks, versions
from stateguard_web.sagas import events, signals
from stateguard_web.sagas.journal import leases
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run


class ServiceError(Exception):
    """Bad input or an action that does not fit the run (shown to the operator as is)."""


class SubmissionError(ServiceError):
    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class ActionNotAllowed(ServiceError):
    pass


class IdempotencyConflict(ServiceError):
    """The idempotency key was used before, by the same user, for a different submission."""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, and how: a user, and the prefix of the API key they used (for the audit)."""

    user: AbstractBaseUser
    via: str = ""


By = AbstractBaseUser | Actor | str | None


def _user(by: By) -> AbstractBaseUser | None:
    return by.user if isinstance(by, Actor) else by if isinstance(by, AbstractBaseUser) else None


def _actor(by: By) -> str:
    if by is None:
        return "system"
    user = _user(by)
    name = str(user.get_username()) if user is not None else str(by)
    return _text(name, "actor")[:150]


def _text(value: str, what: str, limit: int = 2000) -> str:
    """Free text from an operator: PostgreSQL refuses NUL characters, and nothing is endless."""
    if not isinstance(value, str) or "\x00" in value:
        raise ActionNotAllowed(f"{what} must be text without NUL characters")
    if len(value) > limit:
        raise ActionNotAllowed(f"{what} is longer than {limit} characters")
    return value


def _audit(run: Run | None, by: By, action: str, **data: Any) -> None:
    _audit_event(run, by, action, **data).save()


def _audit_event(run: Run | None, by: By, action: str, **data: Any) -> AuditEvent:
    if isinstance(by, Actor) and by.via:
        data["via"] = by.via
    return AuditEvent(run=run, actor=_actor(by), action=action, data=data)


def run_submit(*, agent: str, input: dict[str, Any] | str, by: By = None,
               idempotency_key: str = "") -> Run:
    """Validate ``input`` against the agent's schema, store the run and queue it.

    With an ``idempotency_key`` (a user's), a second submission with the same key returns the
    first run, marked ``run.replayed = True``, and stores nothing; the same key with another
    agent or input raises ``IdempotencyConflict``. The unique constraint decides, so requests
    racing with one key still make one run."""
    if agent not in runtime.agent_names():  # the agents this deployment offers
        raise SubmissionError(f"unknown agent {agent!r}; known agents: {runtime.agent_names()}")
    if isinstance(input, str):
        try:
            input = json.loads(input)
        except json.JSONDecodeError as exc:
            raise SubmissionError(f"input is not valid JSON: {exc}") from exc
    if not isinstance(input, dict):
        raise SubmissionError("input must be a JSON object")
    if "\\u0000" in json.dumps(input):  # PostgreSQL cannot store NUL in JSON text
        raise SubmissionError("input must not contain NUL characters")
    try:
        data = runtime.agent_spec(agent).input_schema.model_validate(input).model_dump(
            mode="json")
    except ValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        raise SubmissionError(f"input does not fit agent {agent!r}", errors) from exc
    user = _user(by)
    key = _idempotency_key(idempotency_key, user)
    fingerprint = _fingerprint(agent, data) if key else ""
    run = Run(agent=agent, input=data, submitted_by=user, idempotency_key=key,
              submission_hash=fingerprint)
    versions.stamp(run)  # the version the run is to go on on, to its end
    event = _audit_event(None, by, "run.submitted", agent=agent)
    try:
        with transaction.atomic():  # the run and its audit event, together or not at all
            run.save()
            event.run = run
            event.save()
    except IntegrityError:
        first = Run.objects.filter(submitted_by=user, idempotency_key=key).first() if key else None
        if first is None:
            raise
        run = first
        if run.submission_hash != fingerprint:
            raise IdempotencyConflict(
                f"idempotency key {key!r} was used for another submission (run {run.code})"
            ) from None
        run.replayed = True
        return run
    # Once the rows are committed: at once, or when the caller's transaction commits.
    queue.send_on_commit(tasks.run_execute, run.pk)
    events.publish_change(run.code, "run.submitted", agent=agent, status=run.status)
    return run


def _idempotency_key(key: str | None, user: AbstractBaseUser | None) -> str:
    if not key:
        return ""
    if user is None:
        raise SubmissionError("an idempotency key needs a user to belong to")
    if not isinstance(key, str) or not 1 <= len(key) <= 200 or not key.isprintable():
        why = "1 to 200 printable characters"
        raise SubmissionError(f"idempotency key must be {why}",
                              [{"loc": ["idempotency_key"], "msg": why}])
    return key


def _fingerprint(agent: str, data: dict[str, Any]) -> str:
    """What a replay must match: the agent and the validated input, canonical."""
    canonical = json.dumps({"agent": agent, "input": data}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def _allowed(action: Action, run: Run, *, pivot: bool = False) -> None:
    """Refuse ``action`` with the state machine's reason (the API's 409, the page's message).
    ``pivot``: the action's rule depends on where the run stands to its pivot (an unwind is
    refused past it, a retry goes forward from it), so that is read too."""
    why = lifecycle.refusal(action, run.status, run=str(run.code), waiting=run.waiting_request,
                            pivot=selectors.run_pivot(run=run) if pivot else None)
    if why is not None:
        raise ActionNotAllowed(why)
    _not_purged(run)


def _not_purged(run: Run) -> None:
    """A run retention purged has no steps or checkpoints left: compensating it would find
    nothing to undo and call it compensated with its charge still out (runs/retention.py)."""
    if run.purged_at is not None:
        raise ActionNotAllowed(
            f"run {run.code} was purged on {run.purged_at:%Y-%m-%d} (retention): its steps and "
            "checkpoints are gone, only its effects (the ledger) and audit trail are kept; "
            "undo an effect by hand (a refund in the payments admin)")


def _request(run: Run, by: By, action: Action, **details: Any) -> None:
    """Leave ``action`` on the run for a worker, and queue it once this transaction commits.

    Until the worker has carried it out (or refused it, under the run's lease), every other
    request is refused: two requests a moment apart (a compensate, then an approval) would
    otherwise reach workers in either order, and the second would act on what the first left.
    The id makes the worker's task idempotent: a duplicate delivery finds no such request."""
    run.request = {"id": uuid.uuid4().hex, "action": str(action), "by": _actor(by), **details}
    run.requested_at = timezone.now()
    run.save(update_fields=["request", "requested_at"])
    queue.send_on_commit(tasks.run_request, run.pk, run.request["id"])
    events.publish_change(run.code, "run.request", action=str(action), by=run.request["by"])


def _pending(run: Run, node: str | None, step_id: str | None) -> Approval:
    pending = run.approvals.filter(status=Approval.Status.PENDING)
    if node:
        pending = pending.filter(node=node)
    if step_id:
        pending = pending.filter(step_id=step_id)
    approvals = list(pending)
    if len(approvals) != 1:
        what = f" for node {node!r}" if node else ""
        what += f" for step {step_id!r}" if step_id else ""
        hint = "; name the step_id" if len(approvals) > 1 else ""
        raise ActionNotAllowed(
            f"run {run.code} has {len(approvals)} pending approvals{what}{hint}")
    return approvals[0]


def _decide(run: Run, by: By, node: str | None, step_id: str | None,
            decision: Approval.Status, reason: str = "") -> Approval:
    """Decide the run's pending approval here, in the operator's transaction: of two decisions
    a moment apart, only the first finds it pending (the run's row lock orders them, and the
    update is conditional all the same). A worker then carries the decision out."""
    approval = _pending(run, node, step_id)
    decided = Approval.objects.filter(pk=approval.pk, status=Approval.Status.PENDING).update(
        status=decision, decided_by=_actor(by), reason=reason, decided_at=timezone.now())
    if not decided:
        raise ActionNotAllowed(f"the approval of {approval.node!r} was already decided")
    return approval


@transaction.atomic
def run_approve(*, run: Run, by: By, node: str | None = None,
                step_id: str | None = None, reason: str = "") -> Run:
    run = _locked(run)
    reason = _text(reason, "reason")
    _allowed(Action.APPROVE, run)
    approval = _decide(run, by, node, step_id, Approval.Status.APPROVED, reason)
    _request(run, by, Action.APPROVE, step_id=approval.step_id)
    _audit(run, by, "run.approved", node=approval.node, step_id=approval.step_id,
           **({"reason": reason} if reason else {}))
    return run


@transaction.atomic
def run_reject(*, run: Run, by: By, node: str | None = None,
               step_id: str | None = None, reason: str = "") -> Run:
    run = _locked(run)
    reason = _text(reason, "reason")
    _allowed(Action.REJECT, run, pivot=True)
    approval = _decide(run, by, node, step_id, Approval.Status.REJECTED, reason)
    _request(run, by, Action.REJECT, step_id=approval.step_id, reason=reason)
    _audit(run, by, "run.rejected", node=approval.node, step_id=approval.step_id,
           reason=reason)
    return run


@transaction.atomic
def run_retry(*, run: Run, by: By, from_step: str | None = None,
              update: dict[str, Any] | None = None) -> Run:
    """Resume a failed run from its failure point, or a run held past its pivot (it goes
    forward only: the step that failed runs again).

    With ``from_step`` (a step id, or a node's name: its last run), retry from that earlier
    step instead (``stateguard.rewind``): a worker undoes it and the steps after it, newest
    first, then runs the graph again from the checkpoint before it with ``update`` applied to
    its state. Refused across a pivot, and for a run partly undone (``lifecycle``)."""
    run = _locked(run)
    if from_step is None:
        if update is not None:
            raise SubmissionError("an update is applied by a retry from a step: name the step",
                                  [{"loc": ["body", "from_step"], "msg": "needed with update"}])
        _allowed(Action.RETRY, run, pivot=True)
        _request(run, by, Action.RETRY)
        _audit(run, by, "run.retry_requested")
        return run
    step = _text(from_step, "from_step", 300)
    _not_purged(run)
    try:
        seen = selectors.run_rewind(run=run, from_step=step)
    except selectors.StepNotFound as exc:
        raise SubmissionError(str(exc), [{"loc": ["body", "from_step"], "msg": str(exc)}]
                              ) from None
    except KeyError:
        raise ActionNotAllowed(f"agent {run.agent!r} is not offered by this deployment"
                               ) from None
    plan = seen.plan
    why = lifecycle.refusal(Action.RETRY_FROM, run.status, run=str(run.code),
                            waiting=run.waiting_request, pivot=plan.pivot, undone=seen.undone)
    if why is not None:
        raise ActionNotAllowed(why)
    try:
        update = rewind.validate_update(update, seen.state_keys)
        if update is not None:
            rewind.fork_node(plan)
    except (ConfigurationError, InvalidRunState) as exc:
        raise SubmissionError(str(exc), [{"loc": ["body", "update"], "msg": str(exc)}]
                              ) from None
    _request(run, by, Action.RETRY_FROM, from_step=plan.step.step_id, node=plan.step.node,
             **({"update": update} if update is not None else {}))
    _audit(run, by, "run.retry_from_requested", node=plan.step.node,
           step_id=plan.step.step_id, undo=[s.node for s in plan.undo],
           **({"update": update} if update is not None else {}))
    return run


@transaction.atomic
def run_compensate(*, run: Run, by: By, reason: str = "") -> Run:
    run = _locked(run)
    reason = _text(reason, "reason")
    _allowed(Action.COMPENSATE, run, pivot=True)
    _request(run, by, Action.COMPENSATE)
    _audit(run, by, "run.compensate_requested", **({"reason": reason} if reason else {}))
    return run


@transaction.atomic
def run_terminate(*, run: Run, by: By, then: str, reason: str = "") -> Run:
    """Stop a run now (``stateguard.stops``), then unwind it (``then="unwind"``: its
    compensations, newest first) or hold it ``needs_attention`` with ``reason`` (``"hold"``).

    A pending run that no worker has taken never starts: it is settled here, at once
    (compensated, nothing to undo; or held). Otherwise the request is left on the run: the
    worker running it sees it at its lease's next heartbeat and stops at the next step
    boundary; should that worker die first, whoever recovers the run carries it out (the
    request is on the row, the sweep queues it again). Refused for a run that is not pending
    or running, and, to unwind, for one past its pivot (hold it instead)."""
    run = _locked(run)
    reason = _text(reason, "reason")
    if then not in THEN:
        why = f"choose {' or '.join(THEN)}"
        raise SubmissionError(f"then must be {' or '.join(THEN)}, not {then!r}",
                              [{"loc": ["body", "then"], "msg": why}])
    why = lifecycle.refusal(Action.TERMINATE, run.status, run=str(run.code),
                            waiting=run.waiting_request,
                            pivot=selectors.run_pivot(run=run) if then == "unwind" else None)
    if why is not None:
        raise ActionNotAllowed(why)
    details = {"then": then, **({"reason": reason} if reason else {})}
    if run.status == Run.Status.PENDING and not Run.objects.filter(leases.held(),
                                                                  pk=run.pk).exists():
        _cancel_pending(run, by, then, reason)  # type: ignore[arg-type]
        _audit(run, by, "run.terminated", status=str(run.status), **details)
        return run
    _request(run, by, Action.TERMINATE, **details)
    _audit(run, by, "run.terminate_requested", **details)
    return run


def _cancel_pending(run: Run, by: By, then: str, reason: str) -> None:
    """A pending run no worker took: it never starts (``run_execute`` takes only a pending
    run, and the row lock held here orders it after this). Nothing ran, nothing to undo."""
    stop = StopRequest(then, _actor(by), reason)  # type: ignore[arg-type]
    run.status = Run.Status.COMPENSATED if then == "unwind" else Run.Status.NEEDS_ATTENTION
    run.error = stop.error().to_dict()
    # A worker that took the run and stalled past its lease is fenced out: it must not start
    # the run after this.
    Run.objects.filter(pk=run.pk).update(
        status=run.status, error=run.error, updated_at=timezone.now(), lease_owner="",
        lease_expires_at=None, fencing_token=F("fencing_token") + 1)
    run.refresh_from_db()
    events.publish_change(run.code, "run.status", status=str(run.status))
    if run.status == Run.Status.NEEDS_ATTENTION:  # operators are told (once this commits)
        signals.run_waits.send(sender=Run, run_code=str(run.code), status=run.status)


@transaction.atomic
def compensation_retry(*, compensation: Compensation, by: By) -> Compensation:
    """Run one failed, skipped-in-doubt or waiting compensation again (a waiting one now
    rather than at its time): new attempts, same key."""
    run = _locked(compensation.run)
    _allowed(Action.RETRY_COMPENSATION, run)
    compensation.refresh_from_db()
    if compensation.status not in RETRYABLE_COMPENSATIONS:
        raise ActionNotAllowed(f"the compensation of {compensation.node!r} is "
                               f"{compensation.status}; only a failed, skipped-in-doubt or "
                               "waiting compensation is retried")
    _request(run, by, Action.RETRY_COMPENSATION, step_id=compensation.step.step_id)
    _audit(run, by, "compensation.retry_requested", node=compensation.node,
           compensation=compensation.pk)
    return compensation


@transaction.atomic
def run_resolve_by_hand(*, run: Run, by: By, note: str) -> Run:
    """An operator undid what StateGuard could not (for example a refund made by hand)."""
    run = _locked(run)
    _allowed(Action.RESOLVE, run)
    if Run.objects.filter(leases.held(), pk=run.pk).exists():  # by the database's clock
        # A worker is acting on the run (recovering it, say); it checked the status under its
        # lease, so settling the run under it now would be overwritten by what it does next.
        raise ActionNotAllowed(f"run {run.code} is being worked on right now; try again when "
                               "the worker is done")
    note = _text(note, "note")
    if not note.strip():
        raise ActionNotAllowed("say what was done by hand")
    run.status = Run.Status.COMPENSATED
    run.save(update_fields=["status", "updated_at"])
    _audit(run, by, "run.resolved_by_hand", note=note)
    events.publish_change(run.code, "run.status", status=str(run.status))
    return run
