"""Celery tasks of webhooks: beat's sweep hands out the due deliveries, one task sends each."""

from __future__ import annotations

from celery import shared_task

from stateguard_web.webhooks import services


@shared_task(acks_late=True)  # safe: a delivery sends only under the claim it was given
def webhook_send(delivery_id: int, claim: str) -> None:
    services.delivery_send(delivery_id=delivery_id, claim=claim)


@shared_task
def webhooks_sweep() -> int:
    """Hand out the deliveries that are due (new, backoff over, or their sender died)."""
    claimed = services.deliveries_claim()
    for delivery_id, claim in claimed:
        webhook_send.delay(delivery_id, claim)
    return len(claimed)
