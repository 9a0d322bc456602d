"""Runs that failed or need attention, made as the journal makes them: the run's steps first,
then its status and error in one UPDATE (the trigger of migration 0022 reads the steps)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from stateguard_web.sagas.models import Run, Step


def incident(agent: str, node: str, error_type: str, *, status: str = Run.Status.FAILED,
             at: datetime | None = None, message: str = "it broke", by: Any = None) -> Run:
    """A run of ``agent`` that got to ``status`` at ``at`` (now), its step ``node`` failed
    with ``error_type`` ("" for no step or no error), after a step that succeeded."""
    at = at or timezone.now()
    run = Run.objects.create(agent=agent, status=Run.Status.RUNNING, submitted_by=by,
                             input={"case": node})
    earlier = at - timedelta(seconds=2)
    Step.objects.create(run=run, step_id=f"{run.code}-first", node="first", started_at=earlier,
                        finished_at=earlier, status=Step.Status.SUCCEEDED, done_seq=1)
    error = {"type": error_type, "message": message, "traceback": ""} if error_type else None
    if node:
        Step.objects.create(run=run, step_id=f"{run.code}-{node}", node=node, started_at=at,
                            finished_at=at, status=Step.Status.FAILED, error=error)
    Run.objects.filter(pk=run.pk).update(status=status, error=error, updated_at=at)
    run.refresh_from_db()
    return run
