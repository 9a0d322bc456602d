"""What the notifications app hears from the journal (connected in ``apps.py``)."""

from __future__ import annotations

import logging
from typing import Any

from stateguard_web.notifications import tasks
from stateguard_web.notifications.services import EVENTS, enabled
from stateguard_web.runs import queue
from stateguard_web.sagas.models import Approval, Notification, Run

logger = logging.getLogger("stateguard.notifications")


def run_status_changed(sender: Any = None, *, run_code: str, status: str, **_: Any) -> None:
    """A worker wrote ``status`` on the run (``signals.run_waits``): queue what operators are
    told about it, once that write commits. Never fails the caller (a saga must not fail for
    its notification)."""
    event = EVENTS.get(str(status))
    if event is None or not enabled():
        return
    try:
        if event == Notification.Event.AWAITING_APPROVAL:
            keys = [f"approval:{step_id}" for step_id in Approval.objects.filter(
                run__code=run_code, status=Approval.Status.PENDING).values_list("step_id",
                                                                               flat=True)]
        else:
            # The operator's request (compensate, retry...) whose outcome this is, if any: the
            # next time the run needs attention is another event; this one again is not.
            request = Run.objects.filter(code=run_code).values_list("request", flat=True).first()
            keys = [f"needs_attention:{(request or {}).get('id') or 'auto'}"]
        for key in keys:
            # Not Celery's delay_on_commit: a broker down at the commit would raise into the
            # worker's saga (issue 22 §2).
            queue.send_on_commit(tasks.notification_send, str(run_code), str(event), key,
                                 lost="this notification is not sent")
    except Exception:
        logger.exception("could not queue the notification of run %s (%s)", run_code, status)
