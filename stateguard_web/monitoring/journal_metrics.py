"""The journal's numbers for Prometheus, read from the database at scrape time.

``JournalCollector`` is a prometheus-client collector: every web process, on every host, reads
the same journal and so reports the same numbers, whichever worker did the work. Two kinds:

Counters and histograms (monotonic) count rows whose key never changes once set: runs by
``created_at`` (submitted), runs by ``finished_at`` (the first outcome a run reached, with
``finished_status``, set once by a trigger, migration 0012), steps by ``finished_at``,
compensation attempts by ``finished_at``. Counting them all again at each scrape would cost a
pass over the journal (0.8 s for a million steps, docs/deploy.md), so each process keeps what
it has counted (``_Tally``): rows older than ``SETTLE_SECONDS`` are added once to running
totals, and only the rows newer than the last of those cuts are read at each scrape, through a
partial index on the key. A process's first scrape reads the whole table once. A row whose
key is older than the cut when it commits (a worker's clock behind by more than
``SETTLE_SECONDS``, or a write delayed that long) is missed by the processes that already
passed it; a step re-run after it finished is counted again by them. Both are rare and off
by one row, never a counter going down.

Gauges (the state now) are read whole at each scrape, from indexes whose rows are few: runs
not yet settled for good (by status), approvals waiting, compensations by status.

Pruning the journal lowers what a freshly started process counts: Prometheus takes that as a
counter reset, once per process.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from stateguard.lifecycle import FINISHED
from stateguard.records import RunStatus

# Rows this much older than the scrape are taken as final: added to the totals once.
SETTLE_SECONDS = 60.0
# A scrape's queries give up after this long rather than hold a web process; a process's
# first read of the whole journal gets longer (seconds per million steps, docs/deploy.md).
STATEMENT_TIMEOUT_MS = 5_000
FIRST_READ_TIMEOUT_MS = 300_000

# Steps call Stripe, provision things, wait on an LLM: milliseconds to minutes.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0)
# Runs include time paused for an approval: seconds to a day.
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)
# Runs that are not settled for good: few at any time, counted whole at each scrape.
OPEN = tuple(s for s in RunStatus if s not in FINISHED)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _seconds(later: str, earlier: str) -> str:
    """SQL for the seconds between two timestamp columns."""
    if connection.vendor == "postgresql":  # float8: numeric (EXTRACT's type) is slower
        return f"CAST(EXTRACT(EPOCH FROM {later} - {earlier}) AS double precision)"
    return f"(julianday({later}) - julianday({earlier})) * 86400.0"


def _bucket(seconds: str, bounds: Sequence[float]) -> str:
    """SQL for the index of the first bucket whose bound is >= the value (len(bounds) for
    +Inf): Prometheus's ``le``, exact at the bounds."""
    if connection.vendor == "postgresql":
        # width_bucket counts the bounds <= its value; of the negated ones, that is the bounds
        # >= ours. One call per row instead of a CASE that computes the value once per bound.
        negated = ", ".join(repr(-b) for b in reversed(bounds))
        return (f"{len(bounds)} - width_bucket(-({seconds}), "
                f"ARRAY[{negated}]::double precision[])")
    whens = " ".join(f"WHEN {seconds} <= {b!r} THEN {i}" for i, b in enumerate(bounds))
    return f"CASE {whens} ELSE {len(bounds)} END"


@dataclass
class _Series:
    buckets: list[int]  # non-cumulative counts per bucket index (last: above every bound)
    total: float = 0.0  # the sum of the observed values

    def add(self, bucket: int, count: int, total: float) -> None:
        self.buckets[bucket] += count
        self.total += total


@dataclass
class _Tally:
    """Counts of rows by labels (and bucket), from rows whose key is at or after ``cut`` read
    again at each scrape, added to totals kept for the rows before it.

    ``sql`` selects ``settled, *labels, bucket, count, sum`` grouped by all but the last two,
    for rows whose key is >= the second parameter; ``settled`` says the key is < the first.
    """

    sql: str
    n_buckets: int = 1
    cut: datetime = _EPOCH
    settled: dict[tuple[str, ...], _Series] = field(default_factory=dict)
    # What ``commit`` keeps, once every query of the scrape has succeeded.
    _pending: tuple[datetime, dict[tuple[str, ...], _Series]] | None = None

    def _new(self) -> _Series:
        return _Series([0] * self.n_buckets)

    def read(self, cursor: Any, now: datetime) -> dict[tuple[str, ...], _Series]:
        new_cut = max(self.cut, now - timedelta(seconds=SETTLE_SECONDS))
        if connection.vendor == "postgresql":
            first = self.cut == _EPOCH
            cursor.execute(f"SET LOCAL statement_timeout = "
                           f"{FIRST_READ_TIMEOUT_MS if first else STATEMENT_TIMEOUT_MS}")
        adapt = connection.ops.adapt_datetimefield_value  # SQLite stores them as text
        cursor.execute(self.sql, [adapt(new_cut), adapt(self.cut)])
        fresh: dict[tuple[str, ...], _Series] = defaultdict(self._new)
        settled: dict[tuple[str, ...], _Series] = defaultdict(self._new, {
            k: _Series(list(v.buckets), v.total) for k, v in self.settled.items()})
        for is_settled, *labels, bucket, count, total in cursor.fetchall():
            key = tuple(str(v) for v in labels)
            (settled if is_settled else fresh)[key].add(int(bucket), int(count),
                                                        float(total or 0))
        # Kept only once the whole scrape has read: a failed query leaves the state as it was.
        self._pending = (new_cut, dict(settled))
        result = {k: _Series(list(v.buckets), v.total) for k, v in settled.items()}
        for key, series in fresh.items():
            into = result.setdefault(key, self._new())
            for i, count in enumerate(series.buckets):
                into.buckets[i] += count
            into.total += series.total
        return result

    def commit(self) -> None:
        if self._pending is not None:
            self.cut, self.settled = self._pending
            self._pending = None


def _histogram(name: str, doc: str, labels: list[str], bounds: Sequence[float],
               data: dict[tuple[str, ...], _Series]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, series in sorted(data.items()):
        cumulative, buckets = 0, []
        for bound, count in zip([*map(repr, bounds), "+Inf"], series.buckets, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric(list(key), buckets, series.total)
    return family


def _counter(name: str, doc: str, labels: list[str],
             rows: Iterable[tuple[tuple[str, ...], float]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(rows):
        family.add_metric(list(key), value)
    return family


def _gauge(name: str, doc: str, labels: list[str],
           rows: Iterable[Sequence[Any]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for *key, value in sorted(rows):
        family.add_metric([str(k) for k in key], float(value))
    return family


class JournalCollector(Collector):
    """Register one per process (``metrics`` does): it keeps the totals."""

    def __init__(self, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock  # bench/metrics_scrape.py runs a day of scrapes in seconds
        self._lock = threading.Lock()  # one scrape at a time per process: they share totals
        self._tallies: dict[str, _Tally] | None = None

    def _make_tallies(self) -> dict[str, _Tally]:
        # Built at the first scrape, when the database vendor is known.
        step_s = _seconds("s.finished_at", "s.started_at")
        run_s = _seconds("finished_at", "created_at")
        return {
            "submitted": _Tally(
                "SELECT created_at < %s, agent, 0, COUNT(*), 0 FROM sagas_run "
                "WHERE created_at >= %s GROUP BY 1, 2"),
            "finished": _Tally(
                f"SELECT finished_at < %s, agent, finished_status, "
                f"{_bucket(run_s, RUN_BUCKETS)}, COUNT(*), SUM({run_s}) FROM sagas_run "
                f"WHERE finished_at >= %s GROUP BY 1, 2, 3, 4", len(RUN_BUCKETS) + 1),
            "steps": _Tally(
                f"SELECT s.finished_at < %s, r.agent, s.node, "
                f"{_bucket(step_s, STEP_BUCKETS)}, COUNT(*), SUM({step_s}) "
                f"FROM sagas_step s JOIN sagas_run r ON r.id = s.run_id "
                f"WHERE s.finished_at >= %s GROUP BY 1, 2, 3, 4", len(STEP_BUCKETS) + 1),
            "attempts": _Tally(
                "SELECT a.finished_at < %s, r.agent, c.node, "
                "CASE WHEN a.ok THEN 'ok' ELSE 'error' END, 0, COUNT(*), 0 "
                "FROM sagas_compensationattempt a "
                "JOIN sagas_compensation c ON c.id = a.compensation_id "
                "JOIN sagas_run r ON r.id = c.run_id "
                "WHERE a.finished_at >= %s GROUP BY 1, 2, 3, 4"),
        }

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._tallies is None:
                self._tallies = self._make_tallies()
            with transaction.atomic(), connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    # Group in memory: a first read's aggregate spills to disk with the default.
                    cursor.execute("SET LOCAL work_mem = '32MB'")
                now = self._clock()
                counts = {name: tally.read(cursor, now) for name, tally in self._tallies.items()}
                if connection.vendor == "postgresql":
                    cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
                gauges = self._gauges(cursor)
            for tally in self._tallies.values():
                tally.commit()
        yield from self._families(counts, gauges)

    @staticmethod
    def _gauges(cursor: Any) -> dict[str, list[tuple[Any, ...]]]:
        open_marks = ", ".join(["%s"] * len(OPEN))
        queries = {
            # sagas_run_status_created: the few runs in these statuses
            "open": (f"SELECT agent, status, COUNT(*) FROM sagas_run "
                     f"WHERE status IN ({open_marks}) GROUP BY 1, 2", [*map(str, OPEN)]),
            # sagas_approval_one_pending_per_node (partial: pending only), then their runs
            "approvals": ("SELECT r.agent, a.node, COUNT(*) FROM sagas_approval a "
                          "JOIN sagas_run r ON r.id = a.run_id WHERE a.status = 'pending' "
                          "GROUP BY 1, 2", []),
            # A pass over compensations: one per step undone, far fewer than steps.
            "compensations": ("SELECT node, status, COUNT(*) FROM sagas_compensation "
                              "GROUP BY 1, 2", []),
        }
        result = {}
        for name, (sql, params) in queries.items():
            cursor.execute(sql, params)
            result[name] = [tuple(row) for row in cursor.fetchall()]
        return result

    @staticmethod
    def _families(counts: dict[str, dict[tuple[str, ...], _Series]],
                  gauges: dict[str, list[tuple[Any, ...]]]) -> Iterator[Metric]:
        yield _counter("stateguard_runs_submitted", "Runs submitted, by agent.", ["agent"],
                       ((k, s.buckets[0]) for k, s in counts["submitted"].items()))
        yield _counter("stateguard_runs_finished",
                       "Runs that reached an outcome, by agent and the first outcome reached "
                       "(succeeded, compensated, needs_attention).", ["agent", "status"],
                       ((k, sum(s.buckets)) for k, s in counts["finished"].items()))
        yield _histogram("stateguard_run_duration_seconds",
                         "Seconds from a run's submission to its first outcome (including "
                         "queueing and time paused for approvals), by agent and outcome.",
                         ["agent", "status"], RUN_BUCKETS, counts["finished"])
        yield _histogram("stateguard_step_duration_seconds",
                         "Seconds a step's body ran, by agent and node (steps that finished, "
                         "in any status).", ["agent", "node"], STEP_BUCKETS, counts["steps"])
        yield _counter("stateguard_compensation_attempts",
                       "Compensation attempts, by agent, node and outcome (ok, error).",
                       ["agent", "node", "outcome"],
                       ((k, s.buckets[0]) for k, s in counts["attempts"].items()))
        yield _gauge("stateguard_runs_open",
                     "Runs not settled for good (pending, running, paused, failed, "
                     "compensating, needs_attention) now, by agent and status.",
                     ["agent", "status"], gauges["open"])
        attention: dict[str, int] = defaultdict(int)
        for agent, status, count in gauges["open"]:
            if status == RunStatus.NEEDS_ATTENTION:
                attention[agent] += count
        yield _gauge("stateguard_runs_needing_attention",
                     "Runs that need an operator now (a compensation failed), by agent.",
                     ["agent"], attention.items())
        yield _gauge("stateguard_approvals_waiting",
                     "Approvals waiting for an operator's decision now, by agent and node.",
                     ["agent", "node"], gauges["approvals"])
        yield _gauge("stateguard_compensations",
                     "Compensations now, by node and status (running, succeeded, "
                     "nothing_to_undo, failed, skipped_in_doubt, waiting).", ["node", "status"],
                     gauges["compensations"])
