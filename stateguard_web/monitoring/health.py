"""``GET /api/health``: does this deployment work? The database answers, the broker answers,
and at least one worker was heard from in the last minute.

``200 {"status": "ok", "checks": {...}}`` or ``503 {"status": "unavailable", "down": [...],
"checks": {...}}``, where ``down`` names the failed checks (``database``, ``broker``,
``workers``). No credentials (load balancers and uptime monitors call it), so it says what is
down and how long each check took, never why in detail: no URLs, host names or driver
messages, which go to the log instead.

It never hangs: the database and broker checks run side by side on a small pool of threads and
the view waits for them ``TIMEOUT`` seconds at most, so a database host that swallows packets
(a connect that would otherwise wait for the kernel, minutes) gives a 503 in about a second.
The pool is bounded: while checks hang, new ones queue behind them and time out too, rather
than pile up threads.

``/healthz`` (healthz.py) stays the cheaper liveness check of one process and its database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from stateguard_web.monitoring import heartbeat

logger = logging.getLogger("stateguard.health")

TIMEOUT = 1.5  # seconds the view waits for all checks together
BROKER_TIMEOUT = 1.0  # Redis connect and read timeout
_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="health")

Check = dict[str, Any]


def _database() -> Check:
    """A new connection and ``SELECT 1``, as a web request makes them (CONN_MAX_AGE=0), on
    this pool thread's own connection, closed again so that no idle backend is left."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        connection.close()
    return {}


@cache
def _redis(url: str) -> redis.Redis:
    return heartbeat.client(url, timeout=BROKER_TIMEOUT)  # one pool per broker URL


def _broker() -> Check:
    """One script call answers both: the broker is up, and how many workers beat recently."""
    seen = heartbeat.alive(_redis(settings.CELERY_BROKER_URL))
    age = None if seen.last_beat_age is None else round(seen.last_beat_age, 1)
    return {"workers": {"ok": seen.count > 0, "alive": seen.count,
                        "last_heartbeat_seconds_ago": age}}


def _timed(check: Callable[[], Check]) -> Callable[[], tuple[float, Check]]:
    def run() -> tuple[float, Check]:
        start = time.perf_counter()
        extra = check()
        return (time.perf_counter() - start) * 1000, extra
    return run


def _outcome(name: str, future: Future[tuple[float, Check]], deadline: float
             ) -> tuple[Check, Check]:
    """The check's entry and what it says about other checks (the broker's about workers)."""
    try:
        ms, extra = future.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        logger.warning("health: %s check timed out after %.1f s", name, TIMEOUT)
        return {"ok": False, "error": f"timed out after {TIMEOUT} s"}, {}
    except Exception as exc:
        logger.warning("health: %s check failed: %r", name, exc)
        return {"ok": False, "error": f"unavailable ({type(exc).__name__})"}, {}
    return {"ok": True, "ms": round(ms, 1)}, extra


def health_check() -> tuple[bool, dict[str, Any]]:
    deadline = time.monotonic() + TIMEOUT
    futures = {"database": _pool.submit(_timed(_database)),
               "broker": _pool.submit(_timed(_broker))}
    checks: dict[str, Check] = {}
    for name, future in futures.items():
        checks[name], extra = _outcome(name, future, deadline)
        checks.update(extra)
    if not checks["broker"]["ok"]:  # unknown, not down: they may be fine without us seeing
        checks["workers"] = {"ok": None, "error": "unknown: the broker did not answer"}
    elif not checks["workers"]["ok"]:
        checks["workers"]["error"] = (f"no worker heard from in the last "
                                      f"{heartbeat.ALIVE_WITHIN:.0f} s")
    down = [name for name, check in checks.items() if check["ok"] is False]
    ok = not down and checks["workers"]["ok"] is True
    body: dict[str, Any] = {"status": "ok" if ok else "unavailable"}
    if not ok:
        body["down"] = down
    body["checks"] = checks
    return ok, body


@never_cache
@require_GET
def health(request: HttpRequest) -> JsonResponse:
    ok, body = health_check()
    return JsonResponse(body, status=200 if ok else 503)
