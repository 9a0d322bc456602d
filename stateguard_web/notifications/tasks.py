"""Celery tasks of notifications. ``notification_send`` keeps the name it had in
``stateguard_web.sagas.tasks``, so that a notification queued before the move still reaches it."""

from __future__ import annotations

from celery import Task, shared_task
from django.conf import settings

from stateguard_web.notifications import services


@shared_task(acks_late=True, bind=True, name="stateguard_web.sagas.tasks.notification_send")
def notification_send(self: Task, run_code: str, event: str, key: str) -> None:
    """Tell the operators that a run waits for them (``services.notification_send``): once per
    event, each channel retried with backoff until it works or the retries run out."""
    retries = settings.STATEGUARD_NOTIFY_RETRIES
    try:
        services.notification_send(run_code=run_code, event=event, key=key,
                                   final=self.request.retries >= retries)
    except services.DeliveryFailed as exc:
        raise self.retry(exc=exc, countdown=services.backoff(self.request.retries),
                         max_retries=retries) from exc
