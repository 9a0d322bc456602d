"""Writes to the saga journal: submissions and operator actions.

Every service is keyword-only, runs in one transaction, writes an ``AuditEvent`` for what the
operator did, and enqueues its Celery task only once that transaction has committed.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from pydantic import ValidationError

from stateguard_web.sagas import runtime, tasks
from stateguard_web.sagas.models import Approval, AuditEvent, Run


class ServiceError(Exception):
    """Bad input or an action that does not fit the run (shown to the operator as is)."""


class SubmissionError(ServiceError):
    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class ActionNotAllowed(ServiceError):
    pass


def _actor(by: AbstractBaseUser | str | None) -> str:
    if by is None:
        return "system"
    name = by if isinstance(by, str) else str(by.get_username())
    return _text(name, "actor")[:150]


def _text(value: str, what: str, limit: int = 2000) -> str:
    """Free text from an operator: PostgreSQL refuses NUL characters, and nothing is endless."""
    if not isinstance(value, str) or "\x00" in value:
        raise ActionNotAllowed(f"{what} must be text without NUL characters")
    if len(value) > limit:
        raise ActionNotAllowed(f"{what} is longer than {limit} characters")
    return value


def _audit(run: Run | None, by: AbstractBaseUser | str | None, action: str,
           **data: Any) -> None:
    AuditEvent.objects.create(run=run, actor=_actor(by), action=action, data=data)


def run_submit(*, agent: str, input: dict[str, Any] | str,
               by: AbstractBaseUser | str | None = None) -> Run:
    """Validate ``input`` against the agent's schema, store the run and queue it."""
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
    with transaction.atomic():
        run = Run.objects.create(agent=agent, input=data,
                                 submitted_by=by if isinstance(by, AbstractBaseUser) else None)
        _audit(run, by, "run.submitted", agent=agent)
        tasks.run_execute.delay_on_commit(run.pk)
    return run


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def _pending(run: Run, node: str | None) -> Approval:
    pending = run.approvals.filter(status=Approval.Status.PENDING)
    if node:
        pending = pending.filter(node=node)
    approvals = list(pending)
    if len(approvals) != 1:
        what = f" for node {node!r}" if node else ""
        raise ActionNotAllowed(f"run {run.code} has {len(approvals)} pending approvals{what}")
    return approvals[0]


def _paused(run: Run) -> None:
    if run.status != Run.Status.PAUSED:
        raise ActionNotAllowed(f"run {run.code} is {run.status}; only a paused run waits for "
                               "a decision")


@transaction.atomic
def run_approve(*, run: Run, by: AbstractBaseUser | str, node: str | None = None) -> Run:
    run = _locked(run)
    _paused(run)
    approval = _pending(run, node)
    _audit(run, by, "run.approved", node=approval.node)
    tasks.run_resume.delay_on_commit(run.pk, _actor(by), approval.node)
    return run


@transaction.atomic
def run_reject(*, run: Run, by: AbstractBaseUser | str, node: str | None = None,
               reason: str = "") -> Run:
    run = _locked(run)
    _paused(run)
    reason = _text(reason, "reason")
    approval = _pending(run, node)
    _audit(run, by, "run.rejected", node=approval.node, reason=reason)
    tasks.run_reject.delay_on_commit(run.pk, _actor(by), approval.node, reason)
    return run


@transaction.atomic
def run_retry(*, run: Run, by: AbstractBaseUser | str) -> Run:
    run = _locked(run)
    if run.status != Run.Status.FAILED:
        raise ActionNotAllowed(f"run {run.code} is {run.status}; only a failed run is retried")
    _audit(run, by, "run.retried")
    tasks.run_retry.delay_on_commit(run.pk, _actor(by))
    return run


COMPENSABLE = frozenset({Run.Status.PAUSED, Run.Status.FAILED, Run.Status.NEEDS_ATTENTION,
                         Run.Status.SUCCEEDED})


@transaction.atomic
def run_compensate(*, run: Run, by: AbstractBaseUser | str) -> Run:
    run = _locked(run)
    if run.status not in COMPENSABLE:
        raise ActionNotAllowed(f"run {run.code} is {run.status}; it cannot be compensated now")
    _audit(run, by, "run.compensate_requested")
    tasks.run_compensate.delay_on_commit(run.pk, _actor(by))
    return run


@transaction.atomic
def run_resolve_by_hand(*, run: Run, by: AbstractBaseUser | str, note: str) -> Run:
    """An operator undid what StateGuard could not (for example a refund made by hand)."""
    run = _locked(run)
    if run.status != Run.Status.NEEDS_ATTENTION:
        raise ActionNotAllowed(f"run {run.code} is {run.status}; only a run that needs "
                               "attention is resolved by hand")
    note = _text(note, "note")
    if not note.strip():
        raise ActionNotAllowed("say what was done by hand")
    run.status = Run.Status.COMPENSATED
    run.save(update_fields=["status", "updated_at"])
    _audit(run, by, "run.resolved_by_hand", note=note)
    return run
