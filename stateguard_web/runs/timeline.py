"""A run's timeline: where its time went and what ran at once, from the journal's own times.

Every bar is a span of the journal: a step (``started_at`` to ``finished_at``), a tool call (a
step tagged ``TOOL_TAG``), a model's turn (a step whose update is the model's message), an
approval's wait (``requested_at`` to ``decided_at``) and a compensation with each of its
attempts (``started_at`` to ``finished_at``; the gaps between them are its back-off). Nothing
is measured here: a timeline is what the journal says, so the run page and
``GET /api/runs/{code}/timeline`` show the same one.

Bars are grouped (the model's turns, steps, tool calls, approvals, compensations) and, within a
group, laid in lanes: a bar goes to the first lane free at its start, so bars that ran one
after the other share a lane and bars that overlapped in time (parallel steps, tool calls the
model asked for at once) are on lanes of their own. A bar that is not over (a running step, a
pending approval, a compensation that waits to retry) ends at ``now`` while the run's clock
runs, and is marked ``open``; so is a step left in doubt by a dead worker, drawn up to the next
thing the run did (its end is unknown).

The builder reads what the caller read already (the run page has every row it needs): it makes
no query of its own. ``read`` reads them for a caller that has only the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stateguard.lifecycle import ATTENTION, FINISHED
from stateguard.tool_calls import TOOL_TAG
from stateguard_web.sagas.models import Approval, Compensation, CompensationAttempt, Run, Step

# The groups, top to bottom, with what a reader calls them.
GROUPS = {"model": "Model", "steps": "Steps", "tools": "Tool calls",
          "approvals": "Approvals", "compensations": "Compensations"}
IN_DOUBT = "in_doubt"  # a step that started and never finished while no worker runs it
# Compensations still to be settled: their bar is open.
_UNSETTLED = frozenset({Compensation.Status.RUNNING, Compensation.Status.WAITING})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a compensation, inside its bar."""

    number: int
    ok: bool
    start: datetime
    end: datetime
    summary: str  # its result, or its error in one line


@dataclass(slots=True)
class Bar:
    """One span of the journal. Its lane is set once its group's bars are all known."""

    group: str  # a key of GROUPS
    kind: str  # model, step, tool_call, approval, compensation
    name: str  # the node, tool, gated node or the node undone
    status: str  # the journal's (a step in doubt: IN_DOUBT)
    start: datetime
    end: datetime  # where it is drawn to: ``now`` or a guess when ``open``
    open: bool = False  # not over (running, waiting), or its end unknown (in doubt)
    step_id: str = ""
    pk: int = 0  # the row's, for a link to it on the run page
    detail: str = ""  # what the model asked for, the error, who decided, the next attempt
    attempts: tuple[Attempt, ...] = ()
    lane: int = 0  # within its group

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)


@dataclass(slots=True)
class Timeline:
    start: datetime  # the run's submission (or its earliest row)
    end: datetime  # ``now`` while the run's clock runs, else its last time
    ticking: bool  # the run waits or works on: open bars grow until it settles
    bars: list[Bar]
    lanes: dict[str, int]  # lanes per group that has bars, in GROUPS' order
    totals: dict[str, float] = field(default_factory=dict)  # seconds, per group (union)
    queued: float = 0.0  # seconds from the submission to the first step

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)

    @property
    def parallel(self) -> int:
        """The most steps or tool calls that ran at once."""
        return max(self.lanes.get("steps", 0), self.lanes.get("tools", 0), 1)


def model_messages(update: Any) -> list[Mapping[str, Any]]:
    """The model's messages in a step's journaled update (``{"messages": [...]}``, as dicts):
    what makes the step a model's turn."""
    messages = update.get("messages") if isinstance(update, Mapping) else None
    if isinstance(messages, Mapping):
        messages = [messages]
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, Mapping) and m.get("type") in ("ai", "AIMessage")]


def step_in_doubt(step: Step, run: Run, now: datetime) -> bool:
    """A step "started" that no worker runs any more: the run stopped running, or its
    worker's lease ran out (it died). Its effect is unknown for good."""
    if step.status != Step.Status.STARTED:
        return False
    lease_lost = run.lease_expires_at is not None and run.lease_expires_at < now
    return run.status != Run.Status.RUNNING or lease_lost


def _one_line(error: Any) -> str:
    if not isinstance(error, Mapping):
        return ""
    message = str(error.get("message") or "").strip().split("\n")[0]
    kind = str(error.get("type") or "")
    return f"{kind}: {message}" if kind and message else kind or message


def _said(step: Step) -> str:
    """A model's turn in a few words: the tools it asked for, or the start of what it said."""
    asked, text = [], ""
    for message in model_messages(step.update):
        asked += [str(c.get("name", "?")) for c in message.get("tool_calls") or ()
                  if isinstance(c, Mapping)]
        content = message.get("content")
        text = text or (content.strip() if isinstance(content, str) else "")
    if asked:
        return "asks for " + ", ".join(asked)
    return text[:80] + ("…" if len(text) > 80 else "")


def _step_bar(step: Step, run: Run, now: datetime, model: bool, ticking: bool) -> Bar:
    tool = TOOL_TAG in (step.tags or ())
    group, kind = ("tools", "tool_call") if tool else ("model", "model") if model else (
        "steps", "step")
    detail = _said(step) if model else _one_line(step.error)
    if step.attempt > 1:
        detail = f"attempt {step.attempt}" + (f"; {detail}" if detail else "")
    status, end, open_ = str(step.status), step.finished_at, False
    if end is None:
        open_ = True
        if step_in_doubt(step, run, now):
            status = IN_DOUBT  # its end is set below: the next thing the run did
        end = now if ticking else step.started_at
    return Bar(group, kind, step.node, status, step.started_at, max(end, step.started_at),
               open_, step.step_id, step.pk, detail)


def _approval_bar(approval: Approval, now: datetime, ticking: bool, last: datetime) -> Bar:
    decided = approval.decided_at
    if decided is not None:
        by = f" by {approval.decided_by}" if approval.decided_by else ""
        detail = f"{approval.status}{by}" + (f": {approval.reason}" if approval.reason else "")
    else:
        detail = "waits for an operator"
    end = decided or (now if ticking else last)
    return Bar("approvals", "approval", approval.node, str(approval.status),
               approval.requested_at, max(end, approval.requested_at), decided is None,
               approval.step_id, approval.pk, detail)


def _compensation_bar(comp: Compensation, attempts: Sequence[CompensationAttempt],
                      now: datetime, ticking: bool) -> Bar:
    tried = tuple(Attempt(a.number, a.ok, a.started_at, max(a.finished_at, a.started_at),
                          a.result if a.ok else _one_line(a.error))
                  for a in sorted(attempts, key=lambda a: a.number))
    start = min([comp.created_at, *(a.start for a in tried)])
    open_ = comp.status in _UNSETTLED
    if open_:
        end = now if ticking else comp.updated_at
    else:
        end = max([a.end for a in tried], default=comp.updated_at)
    detail = f"{len(tried)} attempt{'s' if len(tried) != 1 else ''}"
    if comp.status == Compensation.Status.WAITING and comp.retry_at:
        detail += f"; next at {comp.retry_at.isoformat(timespec='seconds')}"
    if comp.triggered_by != "automatic":
        detail += f"; asked by {comp.triggered_by}"
    return Bar("compensations", "compensation", comp.node, str(comp.status), start,
               max([end, start, *(a.end for a in tried)]), open_, comp.step.step_id, comp.pk,
               detail, tried)


def _doubt_ends(bars: list[Bar], end: datetime) -> list[Bar]:
    """A step in doubt is drawn up to the next thing the run did after it started (recovery,
    most often): when it stopped is unknown, that it stopped by then is not."""
    for bar in bars:
        if bar.status == IN_DOUBT:
            later = [b.start for b in bars if b.start > bar.start and b.status != IN_DOUBT]
            bar.end = min(later, default=end)
    return bars


def _lanes(bars: list[Bar]) -> tuple[list[Bar], dict[str, int]]:
    """Each bar in the first lane of its group that is free at its start (greedy, by start;
    bars that started together in the journal's order): the fewest lanes, and overlapping
    bars never share one."""
    placed, counts = [], {}
    for group in GROUPS:
        free: list[datetime] = []  # per lane: when its last bar ends
        for bar in sorted((b for b in bars if b.group == group), key=lambda b: b.start):
            lane = next((i for i, end in enumerate(free) if end <= bar.start), len(free))
            if lane == len(free):
                free.append(bar.end)
            free[lane] = bar.end
            bar.lane = lane
            placed.append(bar)
        if free:
            counts[group] = len(free)
    return placed, counts


def _union(spans: Iterable[tuple[datetime, datetime]]) -> float:
    """Seconds covered by ``spans`` (overlaps counted once)."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is not None and start < reach:
            start = reach
        if end > start:
            total += (end - start).total_seconds()
        reach = max(reach or end, end)
    return total


def build(*, run: Run, steps: Sequence[Step], approvals: Sequence[Approval],
          compensations: Sequence[Compensation],
          attempts: Mapping[int, Sequence[CompensationAttempt]], now: datetime) -> Timeline:
    """The timeline of ``run`` from its journal rows (``attempts``: per compensation's pk),
    as of ``now``. Makes no query (a compensation's ``step`` must be loaded with it)."""
    ticking = run.status not in FINISHED | ATTENTION
    said = {s.node for s in steps if TOOL_TAG not in (s.tags or ()) and model_messages(s.update)}
    bars = [_step_bar(s, run, now, s.node in said and TOOL_TAG not in (s.tags or ()), ticking)
            for s in steps]
    bars += [_compensation_bar(c, attempts.get(c.pk, ()), now, ticking) for c in compensations]
    times = [run.created_at, *(b.start for b in bars), *(b.end for b in bars)]
    times += [a.decided_at or a.requested_at for a in approvals]
    end = now if ticking else max(times)
    bars += [_approval_bar(a, now, ticking, end) for a in approvals]
    bars, lanes = _lanes(_doubt_ends(bars, end))
    totals = {g: _union((b.start, b.end) for b in bars if b.group == g) for g in lanes}
    first = min((b.start for b in bars if b.kind != "approval"), default=None)
    queued = (first - run.created_at).total_seconds() if first else (
        (end - run.created_at).total_seconds() if run.status == Run.Status.PENDING else 0.0)
    # From the submission, or from an earlier row's time if a clock was off (never drawn
    # off the picture).
    start = min([run.created_at, *(b.start for b in bars)])
    return Timeline(start, max([end, start, *(b.end for b in bars)]), ticking, bars, lanes,
                    totals, max(queued, 0.0))


def read(*, run: Run, now: datetime) -> Timeline:
    """The timeline of ``run``, its rows read now: four queries, each on an index of the run's
    rows (steps without their state after, which a timeline does not show)."""
    steps = list(run.steps.defer("state_after").order_by("started_at", "pk"))
    approvals = list(run.approvals.order_by("requested_at", "pk"))
    compensations = list(run.compensations.select_related("step").defer(
        "step__state_after", "step__update").order_by("created_at", "pk"))
    attempts: dict[int, list[CompensationAttempt]] = {}
    if compensations:
        for attempt in CompensationAttempt.objects.filter(
                compensation_id__in=[c.pk for c in compensations]).order_by("number"):
            attempts.setdefault(attempt.compensation_id, []).append(attempt)
    return build(run=run, steps=steps, approvals=approvals, compensations=compensations,
                 attempts=attempts, now=now)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def as_data(line: Timeline, run: Run) -> dict[str, Any]:
    """The timeline as JSON data (``GET /api/runs/{code}/timeline``): bars by group, then
    start, as the page draws them."""
    order = list(GROUPS)
    bars = sorted(line.bars, key=lambda b: (order.index(b.group), b.start, b.lane))
    return {
        "code": str(run.code), "status": run.status, "started_at": line.start.isoformat(),
        "ends_at": line.end.isoformat(), "ticking": line.ticking,
        "duration_ms": _ms(line.seconds), "queued_ms": _ms(line.queued),
        "totals_ms": {g: _ms(s) for g, s in line.totals.items()}, "lanes": line.lanes,
        "bars": [{"group": b.group, "lane": b.lane, "kind": b.kind, "name": b.name,
                  "status": b.status, "step_id": b.step_id, "started_at": b.start.isoformat(),
                  "finished_at": None if b.open else b.end.isoformat(),
                  "duration_ms": _ms(b.seconds), "detail": b.detail,
                  "attempts": [{"number": a.number, "ok": a.ok,
                                "started_at": a.start.isoformat(),
                                "finished_at": a.end.isoformat(),
                                "duration_ms": _ms((a.end - a.start).total_seconds()),
                                "summary": a.summary} for a in b.attempts]}
                 for b in bars],
    }
