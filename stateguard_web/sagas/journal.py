"""``DjangoJournal``: the core's ``Journal`` protocol over the saga models.

Fencing: when this journal takes a run's lease it remembers the run's fencing token, and every
later write for that run first bumps the run row *only if the token is unchanged*, in the same
transaction as the write. A worker whose lease expired and was taken over (the token grew)
gets ``LeaseLost`` instead of writing; the row lock also serializes a run's writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Max, Q, When
from django.utils import timezone

from stateguard import ErrorInfo, RunLocked
from stateguard.records import (
    ApprovalRecord,
    ApprovalStatus,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
    json_default,
)
from stateguard_web.sagas.models import Approval, Compensation, CompensationAttempt, Run, Step


class LeaseLost(RunLocked):
    """This worker's lease on the run was taken over: it must not write anything more."""


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


def _ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def _json(value: Any) -> Any:
    """Values the JSON column can store (states may hold pydantic models and the like)."""
    return None if value is None else json.loads(json.dumps(value, default=json_default))


def _error_json(error: ErrorInfo | None) -> dict[str, str] | None:
    if error is None:
        return None
    return {"type": error.type, "message": error.message, "traceback": error.traceback}


def _error(data: Any) -> ErrorInfo | None:
    return ErrorInfo(**data) if data else None


class DjangoJournal:
    def __init__(self) -> None:
        self._fences: dict[str, int] = {}  # run id -> fencing token held by this journal

    # -- helpers ----------------------------------------------------------------------------
    @contextmanager
    def _write(self, run_id: str) -> Iterator[int]:
        """A transaction holding the run's row lock, fenced if we hold its lease."""
        with transaction.atomic():
            token = self._fences.get(run_id)
            runs = Run.objects.filter(code=run_id)
            if token is not None:
                if not runs.filter(fencing_token=token).update(updated_at=timezone.now()):
                    raise LeaseLost(run_id)
                pk = runs.values_list("pk", flat=True).get()
            else:
                pk = runs.select_for_update().values_list("pk", flat=True).get()
            yield pk

    # -- runs -------------------------------------------------------------------------------
    def run_begin(self, run_id: str) -> RunRecord:
        run, _ = Run.objects.get_or_create(code=run_id, defaults={"agent": "adhoc",
                                                                  "status": RunStatus.RUNNING})
        return self._run_record(run)

    def run_get(self, run_id: str) -> RunRecord | None:
        run = Run.objects.filter(code=run_id).first()
        return self._run_record(run) if run else None

    @staticmethod
    def _run_record(run: Run) -> RunRecord:
        return RunRecord(str(run.code), RunStatus(run.status), _error(run.error),
                         run.lease_owner or None, _ts(run.lease_expires_at) or 0.0,
                         run.created_at.timestamp(), run.updated_at.timestamp())

    def run_set_status(self, run_id: str, status: RunStatus,
                       error: ErrorInfo | None = None) -> None:
        with self._write(run_id) as pk:
            changes: dict[str, Any] = {"status": status.value}
            if error is not None or status in (RunStatus.RUNNING, RunStatus.SUCCEEDED):
                changes["error"] = _error_json(error)
            Run.objects.filter(pk=pk).update(**changes)

    def lock_acquire(self, run_id: str, owner: str, ttl: float) -> bool:
        now = timezone.now()
        Run.objects.get_or_create(code=run_id, defaults={"agent": "adhoc"})
        free = Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__lt=now)
        taken = Run.objects.filter(free, code=run_id).update(
            lease_owner=owner, lease_expires_at=now + timedelta(seconds=ttl),
            # a new holder gets a new token; the same holder renewing keeps its own
            fencing_token=Case(When(lease_owner=owner, then=F("fencing_token")),
                               default=F("fencing_token") + 1))
        if not taken:
            return False
        self._fences[run_id] = Run.objects.filter(code=run_id).values_list(
            "fencing_token", flat=True).get()
        return True

    def lock_release(self, run_id: str, owner: str) -> None:
        self._fences.pop(run_id, None)
        Run.objects.filter(code=run_id, lease_owner=owner).update(lease_owner="",
                                                                 lease_expires_at=None)

    # -- steps ------------------------------------------------------------------------------
    def step_start(self, run_id: str, step_id: str, node: str,
                   tags: tuple[str, ...] = ()) -> tuple[StepRecord, StepStatus | None]:
        now = timezone.now()
        with self._write(run_id) as pk:
            existing = Step.objects.filter(run_id=pk, step_id=step_id).first()
            previous = StepStatus(existing.status) if existing else None
            step = existing or Step(run_id=pk, step_id=step_id, attempt=0)
            step.node, step.tags, step.status = node, list(tags), Step.Status.STARTED
            step.attempt += 1
            step.started_at, step.finished_at, step.done_seq = now, None, None
            step.update = step.state_after = step.error = None
            step.save()
        return StepRecord(run_id, step_id, node, tuple(tags), StepStatus.STARTED, step.attempt,
                          now.timestamp()), previous

    def step_finish(self, run_id: str, step_id: str, status: StepStatus, *, update: Any = None,
                    state_after: Any = None, error: ErrorInfo | None = None) -> None:
        with self._write(run_id) as pk:
            seq = None
            if status in (StepStatus.SUCCEEDED, StepStatus.VIOLATED):
                last = Step.objects.filter(run_id=pk).aggregate(m=Max("done_seq"))["m"]
                seq = (last or 0) + 1
            Step.objects.filter(run_id=pk, step_id=step_id).update(
                status=status.value, finished_at=timezone.now(), done_seq=seq,
                update=_json(update), state_after=_json(state_after),
                error=_error_json(error))

    def steps(self, run_id: str) -> list[StepRecord]:
        return [StepRecord(run_id, s.step_id, s.node, tuple(s.tags), StepStatus(s.status),
                           s.attempt, s.started_at.timestamp(), _ts(s.finished_at), s.done_seq,
                           s.update, s.state_after, _error(s.error))
                for s in Step.objects.filter(run__code=run_id).order_by("started_at")]

    # -- compensations ----------------------------------------------------------------------
    def compensation_begin(self, record: CompensationRecord) -> CompensationRecord:
        with self._write(record.run_id) as pk:
            step = Step.objects.get(run_id=pk, step_id=record.step_id)
            Compensation.objects.get_or_create(step=step, defaults={
                "run_id": pk, "node": record.node, "idempotency_key": record.idempotency_key,
                "status": record.status.value, "triggered_by": record.triggered_by})
        return next(c for c in self.compensations(record.run_id)
                    if c.step_id == record.step_id)

    def compensation_attempt(self, run_id: str, step_id: str, attempt: AttemptRecord,
                             status: CompensationStatus) -> None:
        with self._write(run_id) as pk:
            comp = Compensation.objects.get(run_id=pk, step__step_id=step_id)
            CompensationAttempt.objects.create(
                compensation=comp, number=attempt.number, started_at=_dt(attempt.started_at),
                finished_at=_dt(attempt.finished_at), ok=attempt.ok, result=attempt.result,
                error=_error_json(attempt.error))
            comp.status = status.value
            comp.save(update_fields=["status", "updated_at"])

    def compensations(self, run_id: str) -> list[CompensationRecord]:
        comps = (Compensation.objects.filter(run__code=run_id).select_related("step")
                 .prefetch_related("attempts"))
        return [CompensationRecord(
            run_id, c.step.step_id, c.node, c.idempotency_key, CompensationStatus(c.status),
            c.triggered_by,
            [AttemptRecord(a.number, a.started_at.timestamp(), a.finished_at.timestamp(), a.ok,
                           a.result, _error(a.error)) for a in c.attempts.all()])
            for c in comps]

    # -- approvals --------------------------------------------------------------------------
    def approval_request(self, record: ApprovalRecord) -> ApprovalRecord:
        with self._write(record.run_id) as pk:
            Approval.objects.get_or_create(run_id=pk, step_id=record.step_id, defaults={
                "node": record.node, "payload": _json(record.payload),
                "requested_at": _dt(record.requested_at)})
        return next(a for a in self.approvals(record.run_id) if a.step_id == record.step_id)

    def approval_decide(self, run_id: str, step_id: str, status: ApprovalStatus, *,
                        by: str | None, reason: str = "") -> bool:
        with self._write(run_id) as pk:
            return bool(Approval.objects.filter(
                run_id=pk, step_id=step_id, status=Approval.Status.PENDING,
            ).update(status=status.value, decided_by=by or "", reason=reason,
                     decided_at=timezone.now()))

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        return [ApprovalRecord(run_id, a.step_id, a.node, a.payload, ApprovalStatus(a.status),
                               a.decided_by or None, a.reason, a.requested_at.timestamp(),
                               _ts(a.decided_at))
                for a in Approval.objects.filter(run__code=run_id).order_by("requested_at")]
