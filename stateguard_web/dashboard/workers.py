"""Is any worker alive, and is the queue keeping up? The banner every page shows when no
worker is, or when the oldest pending run has waited longer than
``STATEGUARD_BACKLOG_WARN_SECONDS`` (``includes/workers.html``).

Without a worker, runs stay pending and operators' requests wait, while the page itself looks
live (its websocket is up). Workers beat into the broker's Redis (``monitoring.heartbeat``);
this reads the beats as ``GET /api/health`` does, with one script call and a short timeout, so
that a Redis that is down costs a page at most ``TIMEOUT`` and says so in the banner. The
oldest pending run is one read of the status index, among the runs the user may see (a
submitter's own: it learns nothing of the others' backlog).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from stateguard_web.accounts import access
from stateguard_web.dashboard.pages import capped_count
from stateguard_web.monitoring import heartbeat
from stateguard_web.sagas.models import Run

TIMEOUT = 0.5  # seconds: a page waits this long for Redis at most


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    alive: int | None  # workers heard from within heartbeat.ALIVE_WITHIN; None: no answer
    last_beat_age: float | None  # seconds since the newest beat; None: none (or no answer)
    pending: int = 0  # runs the user may see that wait for a worker (counted when warned)
    within: float = heartbeat.ALIVE_WITHIN
    oldest_pending_age: float | None = None  # seconds; None: none pending (or not asked)
    threshold: float = 0.0  # STATEGUARD_BACKLOG_WARN_SECONDS

    @property
    def down(self) -> bool:
        """No worker runs anything: none beat lately, or the broker they take runs from is
        out of reach."""
        return not self.alive

    @property
    def backlogged(self) -> bool:
        """Workers run, but the queue is behind: the oldest pending run has waited longer
        than the threshold."""
        return (not self.down and self.oldest_pending_age is not None
                and self.oldest_pending_age > self.threshold)


@cache  # one connection pool per broker URL, kept by the process
def _redis(url: str) -> redis.Redis:
    return heartbeat.client(url, timeout=TIMEOUT)


def worker_health(user: Any) -> WorkerHealth:
    try:
        seen = heartbeat.alive(_redis(settings.CELERY_BROKER_URL))
    except redis.RedisError:  # the banner says so; /api/health and the workers log why
        return WorkerHealth(None, None)
    waiting = access.visible_runs(user).filter(status=Run.Status.PENDING)
    if not seen.count:
        return WorkerHealth(0, seen.last_beat_age, capped_count(waiting))
    threshold = float(settings.STATEGUARD_BACKLOG_WARN_SECONDS)
    oldest = waiting.order_by("created_at").values_list("created_at", flat=True).first()
    age = None if oldest is None else (timezone.now() - oldest).total_seconds()
    behind = age is not None and age > threshold  # then the banner says how many wait
    return WorkerHealth(seen.count, seen.last_beat_age, capped_count(waiting) if behind else 0,
                        oldest_pending_age=age, threshold=threshold)
