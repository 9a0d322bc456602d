"""Reads of the saga journal for views, the API and management commands."""

from __future__ import annotations

import uuid
from typing import Any

from stateguard_web.sagas.models import Run


class RunNotFound(LookupError):
    pass


def run_get(*, code: str | uuid.UUID) -> Run:
    try:
        return Run.objects.get(code=uuid.UUID(str(code)))
    except (ValueError, Run.DoesNotExist) as exc:
        raise RunNotFound(f"no run {code}") from exc


def run_detail(*, run: Run) -> dict[str, Any]:
    """The run with its steps, compensations (and attempts) and approvals, as JSON data."""
    comps = run.compensations.select_related("step").prefetch_related("attempts")
    return {
        "code": str(run.code), "agent": run.agent, "status": run.status, "input": run.input,
        "error": run.error, "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "lease": {"owner": run.lease_owner or None,
                  "expires_at": run.lease_expires_at.isoformat()
                  if run.lease_expires_at else None,
                  "fencing_token": run.fencing_token},
        "steps": [{"node": s.node, "step_id": s.step_id, "status": s.status,
                   "attempt": s.attempt, "started_at": s.started_at.isoformat(),
                   "finished_at": s.finished_at.isoformat() if s.finished_at else None,
                   "update": s.update, "error": s.error}
                  for s in run.steps.order_by("started_at")],
        "compensations": [{"node": c.node, "status": c.status, "triggered_by": c.triggered_by,
                           "idempotency_key": c.idempotency_key,
                           "attempts": [{"number": a.number, "ok": a.ok, "error": a.error}
                                        for a in c.attempts.all()]}
                          for c in comps],
        "approvals": [{"node": a.node, "status": a.status, "decided_by": a.decided_by or None,
                       "reason": a.reason} for a in run.approvals.order_by("requested_at")],
    }
