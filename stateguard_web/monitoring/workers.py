"""The workers and the queue, as the workers page and ``GET /api/workers``, ``/api/queue`` and
``/api/queue/throughput`` show them. Reads only.

- **Workers**: every worker heard from within the last day (``heartbeat``: its host, pids,
  concurrency, code version, last beat), each with the runs it holds now: the live runs whose
  lease names one of its processes (``host:pid:...``). A lease that names no process of a live
  worker is listed apart: its worker died (the sweeper hands the run to recovery) or it is
  not a Celery worker (``manage.py``, a script).
- **Queue**: the messages waiting in the broker's queue, the runs pending and how long the
  oldest has waited, against ``STATEGUARD_BACKLOG_WARN_SECONDS``.
- **Throughput**: runs submitted, started (``Run.started_at``), and finished by outcome
  (``finished_at``, ``finished_status``), per minute, each count from a partial index on its
  time.

One Redis script call answers for the workers and the queue's length together; the broker not
answering is a state of its own (``broker_ok``), never an error: the page says so.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache

import redis
from django.conf import settings
from django.db.models import Count
from django.db.models.functions import TruncMinute
from django.utils import timezone

from stateguard.lifecycle import LIVE
from stateguard_web.monitoring import heartbeat
from stateguard_web.monitoring.version import code_version
from stateguard_web.runs import queue
from stateguard_web.sagas.models import Run

logger = logging.getLogger("stateguard.workers")

TIMEOUT = 0.5  # seconds a page waits for Redis at most
HELD_LIMIT = 500  # runs with a lease read at most (a worker holds its concurrency's worth)
# The outcomes counted per minute, as finished_status names them, after submitted and started.
OUTCOMES = ("succeeded", "compensated", "needs_attention")
SERIES = ("submitted", "started", *OUTCOMES)
MAX_MINUTES = 24 * 60
SETTLE = timedelta(seconds=60)  # a minute that ended this long ago is over: its counts are kept


@dataclass(frozen=True)
class HeldRun:
    code: str
    agent: str
    status: str
    owner: str  # the lease's owner: host:pid:tag


@dataclass(frozen=True)
class Worker:
    name: str  # Celery's hostname (name@host)
    info: heartbeat.WorkerInfo
    last_beat_age: float  # seconds
    runs: list[HeldRun] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.last_beat_age <= heartbeat.ALIVE_WITHIN


@dataclass(frozen=True)
class Workers:
    broker_ok: bool
    workers: list[Worker]  # heard from within the last day, the latest beat first
    unclaimed: list[HeldRun]  # leases naming no process of a live worker
    version: str  # this web process's code

    @property
    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]


@dataclass(frozen=True)
class QueueState:
    depth: int | None  # messages waiting in the broker's queue; None: the broker did not answer
    pending: int  # runs pending
    oldest_code: str | None  # the oldest pending run
    oldest_agent: str
    oldest_created_at: datetime | None
    oldest_age: float | None  # seconds it has waited
    threshold: float  # STATEGUARD_BACKLOG_WARN_SECONDS

    @property
    def backlogged(self) -> bool:
        return self.oldest_age is not None and self.oldest_age > self.threshold


@dataclass(frozen=True)
class Throughput:
    minutes: list[datetime]  # the start of each minute, oldest first; the last is this one
    counts: dict[str, list[int]]  # series name -> a count per minute

    def total(self, name: str) -> int:
        return sum(self.counts[name])


@dataclass(frozen=True)
class Snapshot:
    workers: Workers
    queue: QueueState


@cache  # one connection pool per broker URL, kept by the process
def _redis(url: str) -> redis.Redis:
    return heartbeat.client(url, timeout=TIMEOUT)


def _roster() -> heartbeat.Roster | None:
    try:
        return heartbeat.roster(_redis(settings.CELERY_BROKER_URL), queue.name())
    except redis.RedisError as exc:  # the page says the broker does not answer
        logger.warning("workers: the broker did not answer: %r", exc)
        return None


def _process(owner: str) -> tuple[str, int] | None:
    """The host and pid a lease's owner names (``host:pid:tag``), if it names them."""
    host, _, _tag = owner.rpartition(":")
    host, _, pid = host.rpartition(":")
    return (host, int(pid)) if host and pid.isdigit() else None


def held_runs() -> list[HeldRun]:
    """Live runs that a lease names a holder of (through the status index: live runs are
    few), oldest first."""
    rows = (Run.objects.filter(status__in=list(LIVE)).exclude(lease_owner="")
            .order_by("created_at").values_list("code", "agent", "status", "lease_owner"))
    return [HeldRun(str(code), agent, status, owner)
            for code, agent, status, owner in rows[:HELD_LIMIT]]


def workers_now(roster: heartbeat.Roster | None) -> Workers:
    """The workers of ``roster`` (``None``: the broker did not answer), with the runs each
    holds."""
    if roster is None:
        return Workers(False, [], [], code_version())
    by_process: dict[tuple[str, int], list[HeldRun]] = defaultdict(list)
    unclaimed: list[HeldRun] = []
    live = {(seen.info.host, pid) for seen in roster.workers if seen.alive
            for pid in seen.info.pids}
    for run in held_runs():
        process = _process(run.owner)
        if process is not None and process in live:
            by_process[process].append(run)
        else:
            unclaimed.append(run)
    workers = [Worker(seen.name, seen.info, seen.age,
                      [run for pid in seen.info.pids for run in by_process.get(
                          (seen.info.host, pid), [])] if seen.alive else [])
               for seen in roster.workers]
    return Workers(True, workers, unclaimed, code_version())


def queue_now(depth: int | None) -> QueueState:
    """The queue's state, with ``depth`` from the broker: the pending runs through the status
    index (the oldest, and how many)."""
    pending = Run.objects.filter(status=Run.Status.PENDING)
    oldest = pending.order_by("created_at").values_list("code", "agent", "created_at").first()
    threshold = float(settings.STATEGUARD_BACKLOG_WARN_SECONDS)
    if oldest is None:
        return QueueState(depth, 0, None, "", None, None, threshold)
    code, agent, created_at = oldest
    age = max((timezone.now() - created_at).total_seconds(), 0.0)
    return QueueState(depth, pending.order_by().count(), str(code), agent, created_at, age,
                      threshold)


def snapshot() -> Snapshot:
    """The workers and the queue, for the page: one script call to Redis."""
    roster = _roster()
    return Snapshot(workers_now(roster),
                    queue_now(roster.queue_depth if roster is not None else None))


def workers_snapshot() -> Workers:
    return workers_now(_roster())


def queue_snapshot() -> QueueState:
    try:
        depth: int | None = queue.depth()
    except redis.RedisError as exc:
        logger.warning("queue: the broker did not answer: %r", exc)
        depth = None
    return queue_now(depth)


def _per_minute(column: str, since: datetime, *by: str
                ) -> list[tuple[datetime, tuple[str, ...], int]]:
    rows = (Run.objects.filter(**{f"{column}__gte": since}).order_by()
            .annotate(minute=TruncMinute(column)).values("minute", *by)
            .annotate(n=Count("*")).values_list("minute", *by, "n"))
    return [(row[0], tuple(row[1:-1]), row[-1]) for row in rows]


def _read_minutes(since: datetime) -> dict[datetime, dict[str, int]]:
    """Each series' count per minute, of the rows whose time is at or after ``since``: three
    grouped reads, each over its time's index."""
    found: dict[datetime, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SERIES, 0))
    for name, column in (("submitted", "created_at"), ("started", "started_at")):
        for minute, _, n in _per_minute(column, since):
            found[minute.replace(second=0, microsecond=0)][name] += n
    for minute, (outcome,), n in _per_minute("finished_at", since, "finished_status"):
        if outcome in OUTCOMES:
            found[minute.replace(second=0, microsecond=0)][outcome] += n
    return found


class _SettledMinutes:
    """A process's counts of the minutes that are over (ended ``SETTLE`` ago or more), so that
    the page, re-read every few seconds through a backlog, reads the current minute or two
    rather than the whole hour again (10 000 runs in it: 40 ms of queries each time).

    The times never change once set (``created_at``; ``started_at`` and ``finished_at`` are set
    once, by triggers), so a minute read after it settled stays right; its runs' later changes
    belong to later minutes. A row committed more than ``SETTLE`` after its time (a clock that
    far behind, a transaction held open that long) is missed by the processes that settled its
    minute already, as /metrics' tallies miss it (journal_metrics.py)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[datetime, dict[str, int]] = {}
        self.start: datetime | None = None  # the first minute held
        self.end: datetime | None = None  # the first minute not held (not settled when read)

    def window(self, since: datetime, now: datetime) -> dict[datetime, dict[str, int]]:
        settled = (now - SETTLE).replace(second=0, microsecond=0)  # minutes before it are over
        with self.lock:
            if self.start is None or self.end is None or not self.start <= since <= self.end:
                self.counts, self.start, self.end = {}, since, since  # read the window anew
            assert self.end is not None
            fresh = _read_minutes(self.end)
            minute = self.end
            while minute < settled:
                self.counts[minute] = dict(fresh.get(minute) or dict.fromkeys(SERIES, 0))
                minute += timedelta(minutes=1)
            self.end = max(self.end, settled)
            oldest = now - timedelta(minutes=MAX_MINUTES + 1)
            for old in [m for m in self.counts if m < oldest]:
                del self.counts[old]
            self.start = max(self.start, min(self.counts, default=self.end))
            return {**{m: c for m, c in self.counts.items() if m >= since},
                    **{m: c for m, c in fresh.items() if m >= self.end}}


_settled = _SettledMinutes()


def throughput(minutes: int = 60, now: datetime | None = None) -> Throughput:
    """Runs per minute over the last ``minutes`` minutes (this one included): submitted,
    started, and finished by outcome. The minutes that are over come from this process's
    ``_SettledMinutes``; with ``now`` given (a test's), everything is read."""
    at = now or timezone.now()
    this_minute = at.replace(second=0, microsecond=0)
    starts = [this_minute - timedelta(minutes=minutes - 1 - i) for i in range(minutes)]
    found = _read_minutes(starts[0]) if now is not None else _settled.window(starts[0], at)
    zero = dict.fromkeys(SERIES, 0)
    # A row written a moment after ``at`` is the next minute's: not in the window.
    return Throughput(starts, {name: [found.get(m, zero)[name] for m in starts]
                               for name in SERIES})
