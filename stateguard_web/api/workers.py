"""/api/workers, /api/queue: the workers, the queue and the runs per minute, as the dashboard's
workers page shows them (``monitoring.workers``).

For those who may see every run (a viewer, an operator): the queue and what workers hold tell
of everyone's runs. A submitter gets 403.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from ninja import Query, Router

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import QueueOut, ThroughputFilter, ThroughputOut, WorkersOut
from stateguard_web.monitoring import workers as monitoring

router = Router(tags=["workers"])


def _check(request: HttpRequest) -> None:
    user = principal(request).user
    access.check(user, Ability.VIEW)  # 403 for a user in no role
    if not access.reads_all_runs(user):
        raise PermissionDenied("the workers and the queue are for those who see every run")


def _held(run: monitoring.HeldRun) -> dict[str, Any]:
    return {"code": run.code, "agent": run.agent, "status": run.status,
            "lease_owner": run.owner}


def workers_data(state: monitoring.Workers) -> dict[str, Any]:
    return {
        "broker_ok": state.broker_ok, "version": state.version, "alive": len(state.alive),
        "workers": [{
            "name": w.name, "host": w.info.host, "pid": w.info.pid, "pids": list(w.info.pids),
            "concurrency": w.info.concurrency, "pool": w.info.pool, "version": w.info.version,
            "started_at": w.info.started_at, "alive": w.alive,
            "last_heartbeat_seconds_ago": round(w.last_beat_age, 1),
            "runs": [_held(r) for r in w.runs]} for w in state.workers],
        "unclaimed": [_held(r) for r in state.unclaimed],
    }


def queue_data(queue: monitoring.QueueState) -> dict[str, Any]:
    oldest = None if queue.oldest_code is None else {
        "code": queue.oldest_code, "agent": queue.oldest_agent,
        "created_at": queue.oldest_created_at, "waited_seconds": round(queue.oldest_age or 0, 1)}
    return {"depth": queue.depth, "pending": queue.pending, "oldest_pending": oldest,
            "backlog_warn_seconds": queue.threshold, "backlogged": queue.backlogged}


@router.get("/workers", response={200: WorkersOut, **errors()}, summary="List the workers")
def list_workers(request: HttpRequest) -> dict[str, Any]:
    """Each worker heard from in the last day: host, pids, concurrency, code version, last
    heartbeat, and the runs it holds now; and the runs held by no live worker."""
    _check(request)
    return workers_data(monitoring.workers_snapshot())


@router.get("/queue", response={200: QueueOut, **errors()}, summary="Read the queue")
def read_queue(request: HttpRequest) -> dict[str, Any]:
    """The messages waiting in the broker's queue, the runs pending, and the oldest of them
    with how long it has waited; ``backlogged`` past ``STATEGUARD_BACKLOG_WARN_SECONDS``."""
    _check(request)
    return queue_data(monitoring.queue_snapshot())


@router.get("/queue/throughput", response={200: ThroughputOut, **errors(422)},
            summary="Runs per minute")
def read_throughput(request: HttpRequest, filters: Query[ThroughputFilter]) -> dict[str, Any]:
    """Runs submitted, started, succeeded, compensated and needing attention per minute, over
    the last ``minutes`` minutes (1 to 1440, default 60), oldest first."""
    _check(request)
    rate = monitoring.throughput(filters.minutes)
    return {"minutes": [{"minute": minute, **{name: rate.counts[name][i]
                                              for name in monitoring.SERIES}}
                        for i, minute in enumerate(rate.minutes)]}
