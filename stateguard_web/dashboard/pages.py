"""What each page shows, read from the journal: the runs list, a run's detail, the inboxes.

Reads only. The runs the user may see come from ``accounts.access.visible_runs``, the filtered
list from ``runs.selectors.run_list``; which actions a run accepts from ``stateguard.lifecycle``
(the state machine the services enforce) and whether the user may act from ``access``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Prefetch, QuerySet
from django.http import QueryDict
from django.utils import timezone

from stateguard import lifecycle
from stateguard.history import States
from stateguard.lifecycle import ATTENTION, LIVE, Action, Pivot
from stateguard.records import DONE_COMPENSATIONS, EFFECT_STATUSES
from stateguard.retry import CompensationRetry
from stateguard.spec import GuardSpec, build_compensations
from stateguard.unwind import plan
from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.dashboard import graph, labels, outbox, timeline_svg
from stateguard_web.dashboard.conversation import Turn, conversation
from stateguard_web.payments import selectors as payments
from stateguard_web.runs import runtime, selectors, timeline
from stateguard_web.runs.filters import DEFAULT_SORT
from stateguard_web.runs.timeline import Timeline
from stateguard_web.sagas.ledger import LedgerRow, ledger_rows
from stateguard_web.sagas.models import (
    Approval,
    Compensation,
    CompensationAttempt,
    Effect,
    Run,
    Step,
)

PAGE_SIZE = 50
INBOX_LIMIT = 200
# Counts on every list page and in the navigation stop here ("1000+"): each is an index range
# of at most this many entries, where counting every one of 100 000 runs was a full scan on
# each page view (P5, docs/benchmarks.md). Rare statuses, the ones operators act on, stay exact.
COUNT_CAP = 1000


def role_of(user: Any) -> str:
    """The user's role, in words, as the navigation shows it."""
    if not access.may(user, Ability.VIEW) and not access.may(user, Ability.SUBMIT):
        return "no role"
    if user.is_superuser:
        return "superuser"
    if access.may(user, Ability.OPERATE):
        return "operator"
    if access.reads_all_runs(user):
        return "viewer"
    return "submitter"


def approvals_waiting(user: Any) -> QuerySet[Approval]:
    """Pending approvals of the paused runs ``user`` may see, oldest first."""
    approvals = Approval.objects.filter(status=Approval.Status.PENDING,
                                        run__status=Run.Status.PAUSED)
    if not access.reads_all_runs(user):  # else every run: no second join to the runs
        approvals = approvals.filter(run__in=access.visible_runs(user))
    return approvals.select_related("run", "run__submitted_by").order_by("requested_at", "pk")


def runs_needing_attention(user: Any) -> QuerySet[Run]:
    """Runs ``user`` may see that wait for an operator, the longest-waiting first."""
    return (access.visible_runs(user).filter(status__in=list(ATTENTION))
            .select_related("submitted_by").order_by("updated_at", "pk"))


def capped_count(runs: QuerySet[Any]) -> int:
    """How many rows ``runs`` has, up to ``COUNT_CAP + 1`` (meaning "more than the cap")."""
    return int(runs.order_by()[:COUNT_CAP + 1].count())


def _capped_counts_by_status(runs: QuerySet[Run]) -> dict[str, int]:
    """``capped_count`` of each status of ``runs``, in one round trip: per status, a count over
    a LIMITed index range, the ranges joined by UNION ALL."""
    selects, params = [], []
    for i, (value, _) in enumerate(Run.Status.choices):
        limited = runs.filter(status=value).order_by().values("pk")[:COUNT_CAP + 1]
        sql, limited_params = limited.query.sql_with_params()
        selects.append(f"SELECT %s, COUNT(*) FROM ({sql}) AS s{i}")
        params += [value, *limited_params]
    with connections[runs.db].cursor() as cursor:
        cursor.execute(" UNION ALL ".join(selects), params)
        return {value: int(n) for value, n in cursor.fetchall()}


def inbox_counts(user: Any) -> dict[str, int]:
    """The navigation's counts, capped (``capped_count``)."""
    return {"approvals": capped_count(approvals_waiting(user)),
            "attention": capped_count(runs_needing_attention(user))}


# -- the runs list --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Chip:
    status: str  # "" for every status
    label: str
    count: int
    active: bool
    capped: bool = False  # there are more than ``count``


@dataclass(slots=True)
class RunListPage:
    runs: list[Run]
    chips: list[Chip]
    total: int  # runs matching every filter (at least, if capped)
    page: int
    pages: int  # at least, if capped
    capped: bool = False
    more: bool = False  # there is a next page


def run_list_page(*, user: Any, status: Sequence[str] = (), agent: str = "", q: str = "",
                  created_after: datetime | None = None, created_before: datetime | None = None,
                  node: str = "", what: str = "", step: str = "", error_type: str = "",
                  sort: str = DEFAULT_SORT, page: int = 1) -> RunListPage:
    """One page of the runs ``user`` may see in the order ``sort`` names (newest first by
    default), of any of the ``status``es (every status if none), and the count of each status
    under the other filters (the chips), each capped at ``COUNT_CAP``: one index range per
    status (the (status, -created_at) index), never a count of every run. The total comes
    from those counts; past the cap the page knows only whether there is a next one."""
    filters = {"agent": agent or None, "q": q or None, "created_after": created_after,
               "created_before": created_before, "node": node or None, "what": what or None,
               "step": step or None, "error_type": error_type or None}
    visible = access.visible_runs(user)
    unfiltered = selectors.run_list(runs=visible, **filters)
    counts = _capped_counts_by_status(unfiltered)
    chosen = set(status) & set(counts)
    chips = [Chip(value, label, min(counts[value], COUNT_CAP), value in chosen,
                  counts[value] > COUNT_CAP) for value, label in Run.Status.choices]
    every = Chip("", "All", sum(c.count for c in chips), not chosen,
                 any(c.capped for c in chips))
    counted = [c for c in chips if c.active] or list(chips)
    chips.insert(0, every)
    total, capped = sum(c.count for c in counted), any(c.capped for c in counted)
    pages = max(1, -(-total // PAGE_SIZE))
    page = max(page, 1) if capped else min(max(page, 1), pages)
    runs = selectors.run_list(runs=visible, status=sorted(chosen), sort=sort, **filters)
    offset = (page - 1) * PAGE_SIZE
    rows = list(runs[offset:offset + PAGE_SIZE + 1])
    return RunListPage(rows[:PAGE_SIZE], chips, total, page, pages, capped,
                       len(rows) > PAGE_SIZE)


@dataclass(frozen=True, slots=True)
class ChipLink:
    chip: Chip
    href: str  # the list with this status added to the chosen ones, or taken out


def chip_links(chips: list[Chip], query: QueryDict) -> list[ChipLink]:
    """Each chip's link: a status chip adds its status to those chosen (or takes it out, if
    chosen): several statuses at once; "All" takes every one out. The other filters and the
    order stay; the page goes back to the first."""
    chosen = [s for s in query.getlist("status") if s]
    links = []
    for chip in chips:
        statuses = ([] if not chip.status else
                    [s for s in chosen if s != chip.status] if chip.status in chosen
                    else [*chosen, chip.status])
        then = query.copy()
        then.pop("page", None)
        then.setlist("status", statuses)
        links.append(ChipLink(chip, f"?{then.urlencode()}"))
    return links


@dataclass(frozen=True, slots=True)
class Column:
    """A sortable column's heading: its link sorts by it (the other way, if it does now)."""

    key: str
    label: str
    href: str
    sorted: str  # "ascending", "descending" or "" (aria-sort's words)
    css: str = ""


# The columns the list sorts by, their headings, and which way a first click sorts: times
# newest (and durations longest) first, names from A.
_COLUMNS = (("status", "Status", "", ""), ("agent", "Agent", "", ""),
            ("created", "Created", "-", ""), ("updated", "Updated", "-", "col-updated"),
            ("duration", "Duration", "-", "col-duration"))


def sort_links(sort: str, query: QueryDict) -> dict[str, Column]:
    """The sortable columns' headings by key, for the list in the order ``sort``."""
    columns = {}
    for key, label, first, css in _COLUMNS:
        now = ("descending" if sort == f"-{key}" else "ascending" if sort == key else "")
        then = query.copy()
        then.pop("page", None)
        then["sort"] = (key if now == "descending" else f"-{key}" if now == "ascending"
                        else f"{first}{key}")
        columns[key] = Column(key, label, f"?{then.urlencode()}", now, css)
    return columns


# -- a run's detail ---------------------------------------------------------------------------

def step_state(step: Step, run: Run, now: datetime) -> str:
    """What the run's page calls ``step``: its journal status, or ``labels.IN_DOUBT`` for a
    step that started and never finished while no worker runs it any more (the run stopped
    running, or its worker's lease ran out: it died). Recovery may have unwound the run since,
    but the step itself stays "started" in the journal: its effect is unknown for good."""
    return labels.IN_DOUBT if timeline.step_in_doubt(step, run, now) else str(step.status)


# What became of a step in doubt, by its compensation's status (None: it has none, or not yet).
IN_DOUBT_OUTCOME = {
    None: "",
    Compensation.Status.RUNNING: "Its compensation is running: it looks for an effect and "
                                 "undoes what it finds.",
    Compensation.Status.SUCCEEDED: "Its compensation found an effect and undid it.",
    Compensation.Status.NOTHING_TO_UNDO: "Its compensation looked and found nothing to undo.",
    Compensation.Status.FAILED: "Its compensation failed: see Compensations below.",
    Compensation.Status.SKIPPED_IN_DOUBT: "Its compensation was not run, as it is not declared "
                                          "safe for a step whose effect is unknown: check by "
                                          "hand.",
    Compensation.Status.WAITING: "Its compensation failed for now and is tried again later: "
                                 "see Compensations below.",
}


@dataclass(frozen=True, slots=True)
class StepView:
    """A step as its page shows it: ``state`` is ``step_state``'s, ``note`` says what it means
    when the state alone does not (a step in doubt)."""

    step: Step
    state: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class PlannedUndo:
    """One compensation "compensate now" would run, in the order it would run."""

    node: str
    step_id: str
    why: str  # what the step did, or why its effect is unknown
    note: str = ""  # e.g. "will be skipped: in doubt and not declared safe"


@dataclass(slots=True)
class RunPage:
    run: Run
    steps: list[StepView]
    compensations: list[Compensation]
    effects: list[Effect]
    ledger: list[LedgerRow]  # the effects with what the ledger says of each (sagas.ledger)
    approvals: list[Approval]
    audit: list[Any]
    pending: list[Approval]
    violation: dict[str, Any] | None
    violation_state: Any
    graph_svg: str | None
    actions: set[str]  # the actions this user may take on the run now
    undo_plan: list[PlannedUndo] = field(default_factory=list)
    failed_step: Step | None = None
    request: str | None = None
    can_operate: bool = False
    refundable: set[int] = field(default_factory=set)  # the ledger's charges to offer a refund
    # A compensating run whose compensations wait: when the sweeper gives them their next round.
    next_attempt: datetime | None = None
    # Why compensate and reject are not offered: the run passed its pivot (stateguard.kinds).
    past_pivot: str | None = None
    # Where the run stands to its pivot: past it, a retry goes forward (stateguard.lifecycle).
    pivot: Pivot | None = None
    # Whether its steps offer "Retry from here…" (the confirmation asks the rule for the step
    # chosen: a pivot at or after it refuses it).
    retry_from: bool = False
    # What "Terminate…" may do once the run stopped: "unwind" (not past its pivot), "hold".
    terminate: list[str] = field(default_factory=list)
    # An AI run's conversation: the model's messages and each tool call (conversation.py).
    conversation: list[Turn] = field(default_factory=list)
    # Whether the ledger's e-mails link to the Outbox (outbox.py: make run's mail server).
    outbox: bool = False
    # Where the run's time went, and what ran at once (runs/timeline.py), and its picture.
    timeline: Timeline | None = None
    timeline_svg: str = ""
    timeline_summary: str = ""

    @property
    def run_actions(self) -> set[str]:
        """The actions on the whole run (the header's buttons; the others are per approval or
        per compensation)."""
        return self.actions & {Action.RETRY, Action.COMPENSATE, Action.RESOLVE,
                               Action.TERMINATE}


def run_page(*, run: Run, user: Any) -> RunPage:
    steps = list(run.steps.order_by("started_at", "pk"))
    # The attempts in their order by number alone: their default ordering (a compensation's,
    # then its run's) joined both tables to every read of them.
    attempts = Prefetch("attempts", CompensationAttempt.objects.order_by("number"))
    compensations = list(run.compensations.select_related("step").prefetch_related(attempts)
                         .order_by("created_at", "pk"))
    approvals = list(run.approvals.order_by("requested_at", "pk"))
    pending = [a for a in approvals if a.status == Approval.Status.PENDING]
    violation = selectors._violated_invariant(run, steps)
    violated = [s for s in steps if s.status == Step.Status.VIOLATED]
    can_operate = access.may(user, Ability.OPERATE, run)
    waiting = run.waiting_request
    pivot = selectors.run_pivot(run=run, steps=steps, compensations=compensations)
    actions = {str(a) for a in lifecycle.allowed(run.status, waiting=waiting, pivot=pivot)
               if a in lifecycle.REQUESTS} if can_operate else set()
    if not pending:
        actions -= {Action.APPROVE, Action.REJECT}
    terminate = terminate_choices(run, waiting, pivot) if can_operate else []
    if terminate:  # held, a run past its pivot may be terminated too
        actions.add(str(Action.TERMINATE))
    # Say why there is no compensate button when only the pivot takes it away.
    unwinds = lifecycle.allowed(run.status, waiting=waiting) - lifecycle.allowed(
        run.status, waiting=waiting, pivot=pivot)
    past_pivot = (lifecycle.refusal(Action.COMPENSATE, run.status, run=str(run.code),
                                    pivot=pivot)
                  if can_operate and Action.COMPENSATE in unwinds else None)
    failed_step = next((s for s in reversed(steps) if s.status == Step.Status.FAILED), None)
    views = _step_views(run, steps, compensations)
    effects = list(run.effects.order_by("recorded_at", "pk"))
    page = RunPage(
        run=run, steps=views, compensations=compensations, effects=effects,
        ledger=ledger_rows(effects, compensations), approvals=approvals,
        audit=list(run.audit_events.order_by("created_at", "pk")), pending=pending,
        violation=violation,
        # The whole state, its messages journaled against earlier steps' (stateguard.history).
        violation_state=States(steps).state(violated[-1]) if violated else None,
        graph_svg=_graph(run, views, compensations, pending), actions=actions,
        failed_step=failed_step, request=waiting, can_operate=can_operate,
        next_attempt=next_attempt(run, compensations), past_pivot=past_pivot, pivot=pivot,
        retry_from=can_operate and lifecycle.refusal(
            Action.RETRY_FROM, run.status, waiting=waiting,
            undone=any(c.step.status != Step.Status.REWOUND for c in compensations)) is None,
        conversation=conversation(steps), outbox=outbox.shown_to(user), terminate=terminate)
    if actions & {Action.COMPENSATE, Action.REJECT, Action.TERMINATE}:
        page.undo_plan = undo_plan(run, compensations)
    _timeline(page, steps)
    if access.may(user, Ability.REFUND, run):
        page.refundable = {e.pk for e in page.effects if payments.refundable(e)}
    return page


def _timeline(page: RunPage, steps: list[Step]) -> None:
    """The run's timeline, from the rows the page read already (no query of its own)."""
    line = timeline.build(run=page.run, steps=steps, approvals=page.approvals,
                          compensations=page.compensations,
                          attempts={c.pk: list(c.attempts.all()) for c in page.compensations},
                          now=timezone.now())
    if line.bars:
        page.timeline = line
        page.timeline_summary = timeline_svg.summary(line)
        page.timeline_svg = timeline_svg.render(
            line, title=f"Timeline of the run: {page.timeline_summary}")


def terminate_choices(run: Run, waiting: str | None, pivot: Pivot | None) -> list[str]:
    """What a terminate of ``run`` may do once it stopped, as the service checks it: hold it
    (any pending or running run), and unwind it (not past its pivot)."""
    if lifecycle.refusal(Action.TERMINATE, run.status, waiting=waiting) is not None:
        return []
    unwinds = lifecycle.refusal(Action.TERMINATE, run.status, waiting=waiting, pivot=pivot)
    return ["hold"] if unwinds is not None else ["unwind", "hold"]


def next_attempt(run: Run, compensations: list[Compensation]) -> datetime | None:
    """When the waiting compensations of a compensating run get their next round (the earliest
    ``retry_at``). Not on a run in another status: a run that needs attention keeps its waiting
    ones for the person who compensates it (nothing retries them on their own)."""
    if run.status != Run.Status.COMPENSATING:
        return None
    return min((c.retry_at for c in compensations
                if c.status == Compensation.Status.WAITING and c.retry_at), default=None)


def undo_plan(run: Run, compensations: list[Compensation]) -> list[PlannedUndo]:
    """The compensations an unwind of ``run`` would run now, in order (newest step first):
    the core's own plan (``stateguard.unwind.plan``, with the steps a dead worker left in
    doubt, as an operator's compensate has them), less the steps with no compensation and
    those already undone."""
    try:
        spec = runtime.agent_spec(run.agent)
    except KeyError:
        return []
    guard_spec = GuardSpec((), build_compensations(spec.compensations), {}, CompensationRetry())
    done = {c.step.step_id for c in compensations
            if c.status in DONE_COMPENSATIONS}
    planned = []
    # A step of a run its worker still runs is not in doubt: it runs now, and finishes before
    # an unwind (a terminate stops the run at the next step).
    running = run.status == Run.Status.RUNNING and not (
        run.lease_expires_at is not None and run.lease_expires_at < timezone.now())
    for item in plan(runtime.journal(), str(run.code), guard_spec, include_in_doubt=True):
        step = item.step
        if item.compensation is None or step.step_id in done:
            continue
        if step.status in EFFECT_STATUSES:
            why = f"{step.node} {step.status}"
        elif running and step.status == Step.Status.STARTED:
            planned.append(PlannedUndo(step.node, step.step_id,
                                       f"{step.node} running now: once it finished"))
            continue
        else:
            why = f"{step.node} {step.status}: its effect is unknown, the undo checks first"
        note = ("" if not item.in_doubt or item.compensation.in_doubt_safe
                else "skipped: in doubt, and its compensation is not declared safe to run")
        planned.append(PlannedUndo(step.node, step.step_id, why, note))
    return planned


def _step_views(run: Run, steps: list[Step], compensations: list[Compensation]
                ) -> list[StepView]:
    now = timezone.now()
    undo = {c.step_id: c.status for c in compensations}
    views = []
    for step in steps:
        state = step_state(step, run, now)
        note = ""
        if state == labels.IN_DOUBT:
            outcome = IN_DOUBT_OUTCOME.get(undo.get(step.pk), "")
            note = f"{labels.IN_DOUBT_MEANING} {outcome}".strip()
        views.append(StepView(step, state, note))
    return views


def _graph(run: Run, steps: list[StepView], compensations: list[Compensation],
           pending: list[Approval]) -> str | None:
    lay = graph.agent_layout(run.agent)
    if lay is None:
        return None
    states: dict[str, graph.NodeState] = {}
    undone = {c.step_id: c for c in compensations}
    live = run.status in LIVE
    for view in steps:  # oldest first: a node's latest step wins
        step = view.step
        shown = labels.label("step", view.state)
        css, words = shown.css, shown.words
        current = live and view.state == Step.Status.STARTED
        comp = undone.get(step.pk)
        if comp is not None and comp.status == Compensation.Status.NOTHING_TO_UNDO:
            words += " · nothing to undo"  # the step's own outcome still says what happened
        elif comp is not None:
            undo = labels.label("compensation", comp.status)
            css, words = undo.css, undo.words
            current = comp.status == Compensation.Status.RUNNING and live
            if (view.state == labels.IN_DOUBT
                    and comp.status != Compensation.Status.SKIPPED_IN_DOUBT):  # says it
                words = f"{shown.words} · {words}"
        if step.attempt > 1:
            words += f" · attempt {step.attempt}"
        states[step.node] = graph.NodeState(css, words, current, view.note)
    waiting = labels.LABELS["graph"]["awaiting_approval"]
    for approval in pending:
        states[approval.node] = graph.NodeState(waiting.css, waiting.words,
                                                run.status == Run.Status.PAUSED)
    return graph.render(lay, states, title=f"Graph of the {run.agent} agent")
