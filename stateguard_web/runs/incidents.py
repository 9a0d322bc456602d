"""Incidents: the runs that failed or need attention, grouped by what went wrong.

A group is the runs of one agent, in one status, that failed at the same step with the same type
of error ("the 37 runs of checkout that failed at charge_user with APIConnectionError"): how
many, when the first and the last of them got there, the newest one's error message, and how
many got there in each part of a recent window (the sparkline). Read in two statements: one
GROUP BY over the ``sagas_run_incidents`` partial index alone (index-only), whose columns a
trigger keeps (migration 0022: ``Run.failed_node``, ``Run.error_type``, ``Run.incident_at``),
with the window's counts as filtered aggregates of the same pass; then the newest run of each
group shown, found by the same index (its key and last time). No run's steps or error are read
but the newest's::

    page = incidents.incident_groups(runs=access.visible_runs(user), window="24h")
    page.groups[0].filters  # {"status": "failed", "agent": "checkout", "step": ..., ...}

A group's ``filters`` are the runs list's (``selectors.run_list``), so the list, and a batch
made from its filter, take exactly the group's runs. A run with no step or no error type on
record is in the group of ``NONE`` for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import BooleanField, Count, Max, Min, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.utils import timezone

from stateguard.lifecycle import ATTENTION
from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Run

__all__ = ["NONE", "SORTS", "STATUSES", "WINDOWS", "IncidentGroup", "IncidentPage",
           "incident_groups", "page_json"]

# The runs list's filter value for "none on record": a run that failed at no step we know of
# (it stopped before any), or whose error has no type (an operator's compensate, say).
NONE = selectors.NO_INCIDENT_KEY
STATUSES = tuple(sorted(s.value for s in ATTENTION))  # failed, needs_attention
# Each window the sparkline can show: how long, cut into how many bars.
WINDOWS: dict[str, tuple[timedelta, int]] = {"24h": (timedelta(hours=24), 24),
                                             "7d": (timedelta(days=7), 28),
                                             "30d": (timedelta(days=30), 30)}
# The groups' order: the largest first, or the one that got a run most recently first.
SORTS = {"count": ("-count", "-last_seen"), "recent": ("-last_seen", "-count")}
LIMIT = 100  # groups shown; a page says when there are more


@dataclass(frozen=True, slots=True)
class IncidentGroup:
    agent: str
    step: str  # "" when none is on record
    error_type: str  # "" when none is on record
    status: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample: str  # the newest run's error message
    sample_run: uuid.UUID | None  # that run (None: it moved on between the two reads)
    bars: tuple[int, ...]  # runs that got here in each part of the window, oldest first

    @property
    def filters(self) -> dict[str, str]:
        """The runs list's filters that select this group's runs."""
        return {"status": self.status, "agent": self.agent, "step": self.step or NONE,
                "error_type": self.error_type or NONE}

    @property
    def recent(self) -> int:
        """Runs that got here within the window."""
        return sum(self.bars)


@dataclass(frozen=True, slots=True)
class IncidentPage:
    groups: list[IncidentGroup]
    window: str
    start: datetime  # the window: from start to end, in len(bars) equal parts
    end: datetime
    more: bool  # more groups than shown

    @property
    def bar_width(self) -> timedelta:
        return (self.end - self.start) / WINDOWS[self.window][1]

    @property
    def runs(self) -> int:
        """Runs in the groups shown."""
        return sum(g.count for g in self.groups)


def incident_groups(*, runs: QuerySet[Run], window: str = "24h", agent: str | None = None,
                    status: str | None = None, sort: str = "count", limit: int = LIMIT,
                    now: datetime | None = None) -> IncidentPage:
    """The incidents among ``runs`` (those the caller may see), grouped, in ``sort``'s order:
    at most ``limit`` groups. ``window``: one of ``WINDOWS``; ``status``: one of ``STATUSES``
    (else both). Every condition keeps the statuses' own, so that PostgreSQL can prove the
    partial index covers the query (the newest run's subquery too)."""
    span, parts = WINDOWS[window]
    end = now or timezone.now()
    start, width = end - span, span / parts
    incidents = runs.filter(status__in=[status] if status in STATUSES else STATUSES)
    if agent:
        incidents = incidents.filter(agent=agent)
    # Only the index's columns, so that it answers alone (no run's row is read).
    bars = {f"bar{i}": Count("incident_at", filter=Q(incident_at__gte=start + i * width,
                                                    incident_at__lt=start + (i + 1) * width))
            for i in range(parts)}
    rows = list(incidents.order_by().values(*_KEYS)
                .annotate(count=Count("*"), first_seen=Min("incident_at"),
                          last_seen=Max("incident_at"), **bars)
                .order_by(*SORTS[sort], *_KEYS)[:limit + 1])
    newest = _newest(incidents, rows[:limit])
    return IncidentPage([_group(row, newest.get(_key(row), (None, None)), parts)
                         for row in rows[:limit]], window, start, end, len(rows) > limit)


_KEYS = ("agent", "failed_node", "error_type", "status")  # a group's, the index's order


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in _KEYS)


def _newest(incidents: QuerySet[Run], rows: list[dict[str, Any]]
            ) -> dict[tuple[Any, ...], tuple[Any, Any]]:
    """The code and error message of each group's newest run: the run of the group whose
    ``incident_at`` is the group's last, found by the whole key of the index, all in one
    statement (a row value ``IN (VALUES ...)``: one index probe per group). A subquery per
    group, or an OR of a filter per group, cost the ORM more to build than the database to
    run; a subquery in the GROUP BY's select list ran for every run, not every group."""
    if not rows:
        return {}
    connection = connections[incidents.db]
    quote = connection.ops.quote_name
    table = quote(Run._meta.db_table)
    columns = ", ".join(f"{table}.{quote(Run._meta.get_field(k).column)}"
                        for k in (*_KEYS, "incident_at"))
    at = Run._meta.get_field("incident_at")
    keys = RawSQL(f"({columns}) IN (VALUES {', '.join(['(%s, %s, %s, %s, %s)'] * len(rows))})",
                  [value for row in rows for value in (
                      *_key(row), at.get_db_prep_value(row["last_seen"], connection))],
                  output_field=BooleanField())
    found: dict[tuple[Any, ...], tuple[Any, Any]] = {}
    for run in (incidents.filter(keys).order_by()
                .values(*_KEYS, "code", message=KT("error__message"))):
        found.setdefault(_key(run), (run["code"], run["message"]))
    return found


def _group(row: dict[str, Any], newest: tuple[Any, Any], parts: int) -> IncidentGroup:
    code, message = newest
    return IncidentGroup(
        agent=row["agent"], step=row["failed_node"] or "", error_type=row["error_type"] or "",
        status=row["status"], count=row["count"], first_seen=row["first_seen"],
        last_seen=row["last_seen"], sample="" if message is None else str(message),
        sample_run=None if code is None else uuid.UUID(str(code)),
        bars=tuple(row[f"bar{i}"] for i in range(parts)))


def page_json(page: IncidentPage) -> dict[str, Any]:
    """The page as JSON data (GET /api/incidents)."""
    return {
        "window": page.window, "start": page.start.isoformat(), "end": page.end.isoformat(),
        "bar_seconds": int(page.bar_width.total_seconds()), "more": page.more,
        "items": [{"agent": g.agent, "step": g.step, "error_type": g.error_type,
                   "status": g.status, "count": g.count,
                   "first_seen": g.first_seen.isoformat(),
                   "last_seen": g.last_seen.isoformat(), "sample_message": g.sample,
                   "sample_run": g.sample_run and str(g.sample_run), "bars": list(g.bars),
                   "filter": g.filters}
                  for g in page.groups],
    }
