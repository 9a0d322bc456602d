"""Webhooks' reads: a run's deliveries, each with its attempts (the run page, the API)."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch

from stateguard_web.sagas.models import Run
from stateguard_web.webhooks.models import Attempt, Delivery, RunWebhook


def run_webhooks(*, run: Run) -> dict[str, Any]:
    """The run's webhook URL (None: none) and its deliveries, oldest first."""
    hook = RunWebhook.objects.filter(run=run).values_list("url", flat=True).first()
    if hook is None:  # most runs: one query, no more
        return {"url": None, "deliveries": []}
    deliveries = (Delivery.objects.filter(run=run).order_by("created_at", "id")
                  .prefetch_related(Prefetch("tries", Attempt.objects.order_by("number"))))
    return {"url": hook, "deliveries": [{
        "id": d.event_id, "type": d.type, "status": d.status, "created": d.created_at,
        "attempts": d.attempts, "next_attempt_at": d.next_attempt_at,
        "delivered_at": d.delivered_at,
        "tries": [{"number": a.number, "url": a.url, "started_at": a.started_at,
                   "duration_ms": a.duration_ms, "status_code": a.status_code,
                   "response": a.response, "error": a.error, "ok": a.ok}
                  for a in d.tries.all()],
    } for d in deliveries]}
