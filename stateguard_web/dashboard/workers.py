"""Is any worker alive? The banner every page shows when none is (``includes/workers.html``).

Without a worker, runs stay pending and operators' requests wait, while the page itself looks
live (its websocket is up). Workers beat into the broker's Redis (``monitoring.heartbeat``);
this reads the beats as ``GET /api/health`` does, with one script call and a short timeout, so
that a Redis that is down costs a page at most ``TIMEOUT`` and says so in the banner.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import redis
from django.conf import settings

from stateguard_web.accounts import access
from stateguard_web.dashboard.pages import capped_count
from stateguard_web.monitoring import heartbeat
from stateguard_web.sagas.models import Run

TIMEOUT = 0.5  # seconds: a page waits this long for Redis at most


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    alive: int | None  # workers heard from within heartbeat.ALIVE_WITHIN; None: no answer
    last_beat_age: float | None  # seconds since the newest beat; None: none (or no answer)
    pending: int = 0  # runs the user may see that wait for a worker (counted when none is)
    within: float = heartbeat.ALIVE_WITHIN

    @property
    def down(self) -> bool:
        """No worker runs anything: none beat lately, or the broker they take runs from is
        out of reach."""
        return not self.alive


@cache  # one connection pool per broker URL, kept by the process
def _redis(url: str) -> redis.Redis:
    return heartbeat.client(url, timeout=TIMEOUT)


def worker_health(user: Any) -> WorkerHealth:
    try:
        seen = heartbeat.alive(_redis(settings.CELERY_BROKER_URL))
    except redis.RedisError:  # the banner says so; /api/health and the workers log why
        return WorkerHealth(None, None)
    if seen.count:
        return WorkerHealth(seen.count, seen.last_beat_age)
    waiting = access.visible_runs(user).filter(status=Run.Status.PENDING)
    return WorkerHealth(0, seen.last_beat_age, capped_count(waiting))
