"""A run's journal read as the events its live views get, with ids a client resumes from:
``GET /api/runs/{code}/events`` (Server-Sent Events, ``api/event_stream.py``).

The dashboard's websockets forward what the workers publish (``sagas.events``), and a page
that reconnects re-reads the run. A client that is no browser wants the events themselves,
none lost across a reconnect and none twice. So each event here is a fact the journal holds,
read from the database, in the websocket's shape (``{"type", "run", "node", "step_id",
"data", "at"}``), with the journal's own time:

=========================  ===========================================================
``step.started``           a step's row, at ``started_at`` (of its latest attempt)
``step.succeeded``,        its end, at ``finished_at``: succeeded, failed, violated
``step.failed``,           (``invariant.violated``), or rewound by a retry from an
``invariant.violated``,    earlier step (``step.rewound``: this stream's own; the
``step.rewound``           websocket's pages re-read the run). A pause has none: the
                           run's ``paused`` follows
``approval.requested``,    an approval's row, at ``requested_at`` and ``decided_at``
``approval.decided``
``compensation.attempt``   each attempt's row, at its ``finished_at``
``compensation.succeeded``  a compensation's outcome, at its ``updated_at``
``compensation.failed``,
``compensation.waiting``
``run.status``             the run's status, whenever it differs from the last one sent
=========================  ===========================================================

Facts go oldest first, by time (of one time: a start before an end, an attempt before its
outcome). A key names a fact for good (a step's attempt and
phase, an attempt's number...), so a fact is never sent twice under two keys; a step run
again is a new attempt, whose facts are new ones. The run's status is not a history in the
journal, only what it is now: ``run.status`` says each status the stream found (a status the
run passed through between two reads, milliseconds apart, is not sent; the last one always
is), and it comes after the facts that led to it (the status is read before them).

Ids. A fact can become visible after a later one (two parallel tool calls commit their
starts in either order), so "everything after the last time sent" would lose it. An id is a
cursor: ``after`` (every fact at or before this time was sent, or is given up on), the
digests of the facts sent since then (at most ``MAX_SEEN``, over the last ``WINDOW``
microseconds of the run's own clock), and the last status sent. A client that resumes
from it gets every fact after ``after`` whose digest it does not hold: a fact that became
visible up to ``WINDOW`` later than a newer one is still sent; only one later than that (no
known cause) is not.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Model, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from stateguard.records import STUCK_COMPENSATIONS, CompensationStatus, ErrorInfo, RunStatus
from stateguard_web.sagas.models import Approval, Compensation, CompensationAttempt, Run, Step

# Statuses at which the stream ends: the run stopped, and only a person moves it on (a retry,
# a compensation, a resolution; a client connects again then). Not ``paused``: an approval
# is part of a run's course, and a client watching it waits for the decision.
STOPPED = frozenset({RunStatus.SUCCEEDED, RunStatus.COMPENSATED, RunStatus.FAILED,
                     RunStatus.NEEDS_ATTENTION})
WINDOW = 10_000_000  # microseconds: how much later than a newer fact a fact may still come
MAX_SEEN = 64  # digests an id carries at most (over the newest facts sent)
_DIGEST = 8  # characters of a fact's digest (6 bytes, base64url)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ID = re.compile(r"1\.(?P<after>\d{1,19})\.(?P<status>[a-z_]{0,20})\."
                 rf"(?P<seen>(?:[A-Za-z0-9_-]{{{_DIGEST}}}){{0,{MAX_SEEN}}})")
_STATUSES = frozenset(s.value for s in RunStatus)
_VIOLATION = re.compile(r"invariant (['\"])(?P<name>.*?)\1 violated[^:]*: (?P<message>.*)",
                        re.S)
_STEP_ENDS = {Step.Status.SUCCEEDED: "step.succeeded", Step.Status.FAILED: "step.failed",
              Step.Status.VIOLATED: "invariant.violated", Step.Status.REWOUND: "step.rewound"}


class BadEventId(ValueError):
    """A ``Last-Event-ID`` this server did not make."""


def _micros(at: datetime) -> int:
    return (at - _EPOCH) // timedelta(microseconds=1)


def _at(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def digest(key: str) -> str:
    return base64.urlsafe_b64encode(hashlib.blake2b(key.encode(), digest_size=6).digest()
                                    ).decode()


@dataclass(frozen=True, slots=True)
class Fact:
    at: int  # microseconds since 1970, the journal's time
    key: str  # names the fact for good: "s:<step id>:<attempt>:started", ...
    event: dict[str, Any]  # what is sent: the websocket's shape
    # Facts of one time go in this order: a step's start before its end, an approval asked
    # for before its decision, a compensation's attempts before its outcome (a fast step's
    # two facts may share a microsecond).
    rank: int = 0


@dataclass(slots=True)
class Cursor:
    """Where a client is in a run's events (see the module's docstring): what an event's id
    says, and what a stream keeps as it sends."""

    after: int = -1
    seen: dict[str, int | None] = field(default_factory=dict)  # digest -> time (None: unknown)
    status: str = ""

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The cursor an id says; ``BadEventId`` for anything else."""
        match = _ID.fullmatch(text)
        if match is None or (match["status"] and match["status"] not in _STATUSES):
            raise BadEventId("not an id of this run's events: reconnect without "
                             "Last-Event-ID to read them from the start")
        seen = match["seen"]
        return cls(int(match["after"]), {seen[i:i + _DIGEST]: None
                                         for i in range(0, len(seen), _DIGEST)},
                   match["status"])

    def id(self) -> str:
        return f"1.{max(self.after, 0)}.{self.status}.{''.join(sorted(self.seen))}"

    def new(self, facts: Iterable[Fact]) -> list[Fact]:
        """Of ``facts``, those the client has not had, oldest first; the digests it holds of
        facts that no longer exist (a step run again) are dropped."""
        fresh, known = [], {}
        for fact in facts:
            if fact.at <= self.after:
                continue
            d = digest(fact.key)
            if d in self.seen:
                known[d] = fact.at
            else:
                fresh.append(fact)
        self.seen = {d: at for d, at in self.seen.items() if at is not None or d in known}
        self.seen.update(known)
        return sorted(fresh, key=lambda f: (f.at, f.rank, f.key))

    def sent(self, fact: Fact) -> None:
        """``fact`` went to the client: its id (``id()``) now says so."""
        self.seen[digest(fact.key)] = fact.at
        newest = max(at for at in self.seen.values() if at is not None)
        after = max(self.after, newest - WINDOW)
        if len(self.seen) > MAX_SEEN:  # keep the newest: the older ones are given up on
            ordered = sorted((at or newest for at in self.seen.values()), reverse=True)
            after = max(after, ordered[MAX_SEEN])
        self.after = after
        self.seen = {d: at for d, at in self.seen.items() if at is None or at > after}


def _event(type: str, run: str, at: datetime, node: str | None = None,
           step_id: str | None = None, **data: Any) -> dict[str, Any]:
    return {"type": type, "run": run, "node": node, "step_id": step_id, "data": data,
            "at": at.timestamp()}


def _error(error: Any) -> str | None:
    info = ErrorInfo.from_dict(error)
    return None if info is None else str(info)


def _step_facts(code: str, step: Step) -> Iterable[Fact]:
    prefix = f"s:{step.step_id}:{step.attempt}"
    yield Fact(_micros(step.started_at), f"{prefix}:started", _event(
        "step.started", code, step.started_at, step.node, step.step_id, attempt=step.attempt,
        in_doubt_rerun=step.prev_status == Step.Status.STARTED))
    end = _STEP_ENDS.get(step.status)
    if end is None or step.finished_at is None:
        return
    data: dict[str, Any] = {"attempt": step.attempt}
    if step.status in (Step.Status.FAILED, Step.Status.VIOLATED):
        data["error"] = _error(step.error)
    if step.status == Step.Status.VIOLATED:
        match = _VIOLATION.match(str((step.error or {}).get("message", "")))
        data.update(invariant=match["name"] if match else None,
                    message=match["message"] if match else data["error"])
    yield Fact(_micros(step.finished_at), f"{prefix}:{step.status}", _event(
        end, code, step.finished_at, step.node, step.step_id, **data), rank=2)


def _approval_facts(code: str, approval: Approval) -> Iterable[Fact]:
    yield Fact(_micros(approval.requested_at), f"a:{approval.pk}:requested", _event(
        "approval.requested", code, approval.requested_at, approval.node, approval.step_id,
        approval=approval.pk, payload=approval.payload))
    if approval.decided_at is not None and approval.status != Approval.Status.PENDING:
        yield Fact(_micros(approval.decided_at), f"a:{approval.pk}:decided", _event(
            "approval.decided", code, approval.decided_at, approval.node, approval.step_id,
            approval=approval.pk, decision=approval.status, by=approval.decided_by or None,
            reason=approval.reason), rank=2)


def _compensation_facts(code: str, comp: Compensation) -> Iterable[Fact]:
    attempts: list[CompensationAttempt] = list(comp.attempts.all())
    for a in attempts:
        yield Fact(_micros(a.finished_at), f"c:{comp.pk}:{a.number}", _event(
            "compensation.attempt", code, a.finished_at, comp.node, comp.step.step_id,
            compensation=comp.pk, attempt=a.number, ok=a.ok, error=_error(a.error)), rank=1)
    status = CompensationStatus(comp.status)
    if status == CompensationStatus.RUNNING:
        return
    type = ("compensation.failed" if status in STUCK_COMPENSATIONS
            else "compensation.waiting" if status == CompensationStatus.WAITING
            else "compensation.succeeded")
    count = comp.attempt_count  # type: ignore[attr-defined]
    data: dict[str, Any] = {"compensation": comp.pk, "status": str(status), "attempts": count}
    if comp.retry_at is not None:
        data["retry_at"] = comp.retry_at.timestamp()
    yield Fact(_micros(comp.updated_at), f"c:{comp.pk}:{status}:{count}", _event(
        type, code, comp.updated_at, comp.node, comp.step.step_id, **data), rank=3)


def facts(*, run: Run, after: int = -1) -> list[Fact]:
    """The run's facts later than ``after`` (microseconds), in no order: three queries, each
    the run's rows changed since (a compensation's attempts end before its last save)."""
    code, since = str(run.code), _at(max(after, 0))
    found: list[Fact] = []
    steps = (Step.objects.filter(run=run).filter(Q(started_at__gt=since)
                                                 | Q(finished_at__gt=since))
             .only("step_id", "node", "status", "attempt", "started_at", "finished_at",
                   "prev_status", "error"))
    for step in steps:
        found += _step_facts(code, step)
    approvals = Approval.objects.filter(run=run).filter(Q(requested_at__gt=since)
                                                        | Q(decided_at__gt=since))
    for approval in approvals.defer("run"):
        found += _approval_facts(code, approval)
    comps = (Compensation.objects.filter(run=run, updated_at__gt=since)
             .select_related("step").only("node", "status", "retry_at", "updated_at",
                                          "step__step_id")
             .prefetch_related(Prefetch("attempts", CompensationAttempt.objects.filter(
                 finished_at__gt=since).order_by("number")))
             .annotate(attempt_count=Count("attempts")))
    for comp in comps:
        found += _compensation_facts(code, comp)
    return [f for f in found if f.at > after]


def _newest(model: type[Model], time: Any) -> Subquery:
    rows = model.objects.filter(run_id=OuterRef("pk")).order_by().values("run_id")
    return Subquery(rows.annotate(newest=Max(time)).values("newest")[:1])


def _count(model: type[Model]) -> Subquery:
    rows = model.objects.filter(run_id=OuterRef("pk")).order_by().values("run_id")
    return Subquery(rows.annotate(count=Count("pk")).values("count")[:1])


def watched(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with what ``fingerprint`` reads: the newest time of their steps, approvals and
    compensations and how many steps they have, in the same query (a subquery each, on the
    run's rows by index)."""
    return runs.annotate(
        steps_newest=_newest(Step, Coalesce("finished_at", "started_at")),
        step_count=_count(Step),
        approvals_newest=_newest(Approval, Coalesce("decided_at", "requested_at")),
        compensations_newest=_newest(Compensation, "updated_at"))


def fingerprint(run: Run) -> tuple[Any, ...]:
    """What changes when the journal writes something of ``run`` that makes an event (a
    ``watched`` run): a stream polls this, and reads the facts only when it changed. A fact
    whose row commits with an older time than the newest one is not seen here; the live
    update its write publishes makes the stream read anyway."""
    return (run.status, run.steps_newest, run.step_count,  # type: ignore[attr-defined]
            run.approvals_newest, run.compensations_newest)  # type: ignore[attr-defined]


def status_event(run: Run) -> dict[str, Any]:
    """``run.status``, with the run's error in one line when it stopped on one."""
    data: dict[str, Any] = {"status": run.status}
    if run.error:
        data["error"] = _error(run.error)
    return _event("run.status", str(run.code), run.updated_at, **data)
