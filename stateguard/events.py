"""Events StateGuard emits while it works, for live views (the web app's websockets).

A callback gets one ``Event`` at a time; it runs inline, so it should be quick (queue the event,
do not send it over the network). An exception in the callback is logged and never stops a saga.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger("stateguard")

# A step that pauses itself by interrupt() (journaled "paused") has no event of its own: the
# pause stops the run, whose "run.status" (paused) follows, and a live view re-reads the run.
EventType = Literal[
    "step.started", "step.succeeded", "step.failed", "invariant.violated",
    "compensation.attempt", "compensation.succeeded", "compensation.failed",
    "compensation.waiting",
    "approval.requested", "approval.decided", "run.status",
    "run.terminated",  # an operator's stop carried out (stateguard.stops): unwound or held
]


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    run_id: str
    node: str | None = None
    step_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


EventCallback = Callable[[Event], None]


def emit(callback: EventCallback | None, event: Event) -> None:
    if callback is None:
        return
    try:
        callback(event)
    except Exception:  # a broken listener must never break the saga it listens to
        logger.exception("stateguard event callback failed for %s", event.type)
