"""What the batch tests share: checkout runs held failed by a real Stripe outage, and the
operators' requests carried out in this process as a worker would."""

from __future__ import annotations

from typing import Any

from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Run

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens: Stripe is down


def carry_out_requests() -> None:
    """What workers do with the operators' requests waiting on runs (``tasks.run_request``)."""
    for pk, request in Run.objects.filter(request__isnull=False).values_list("pk", "request"):
        tasks.run_request(pk, request["id"])


def failed_checkouts(settings: Any, localstripe_url: str, n: int, by: Any) -> list[Run]:
    """``n`` checkouts over 100.00 that waited for their approval (their customer made), were
    approved (by ``by``) during an outage and are held failed at their charge: its
    compensation (a refund of whatever charge it finds) is what a compensate runs. Executed in
    this process as a worker would; Stripe (localstripe) answers again afterwards."""
    settings.STRIPE_API_KEY, settings.STRIPE_API_BASE = "sk_test_stateguard", localstripe_url
    runs = []
    for i in range(n):
        runs.append(services.run_submit(agent="checkout", input={
            "email": f"c{i}@example.com", "amount": 250_00 + i}))
        tasks.run_execute(runs[-1].pk)
    settings.STRIPE_API_BASE = UNREACHABLE
    for run in runs:
        services.run_approve(run=run, by=by)
    carry_out_requests()
    settings.STRIPE_API_BASE = localstripe_url
    for run in runs:
        run.refresh_from_db()
        assert run.status == Run.Status.FAILED, run
    return runs
