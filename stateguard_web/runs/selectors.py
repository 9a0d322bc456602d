"""Reads of the saga journal for views, the API and management commands."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

from stateguard import kinds, rewind
from stateguard.exceptions import InvalidRunState
from stateguard.instrument import node_tags
from stateguard.lifecycle import Pivot
from stateguard.records import StepRecord, StepStatus
from stateguard.tools import tool_nodes, tools_of
from stateguard_web.lib import rows as sql_rows
from stateguard_web.runs import agent_map, runtime, versions
from stateguard_web.sagas import ledger
from stateguard_web.sagas.models import (
    Approval,
    AuditEvent,
    Compensation,
    CompensationAttempt,
    Effect,
    Run,
    Step,
    run_duration,
)


class RunNotFound(LookupError):
    pass


class NotFound(LookupError):
    """No such approval or compensation (where the caller may look)."""


def run_pivot(*, run: Run, steps: Iterable[Step] | None = None,
              compensations: Iterable[Compensation] | None = None) -> Pivot | None:
    """Where ``run`` stands to its pivot (``stateguard.kinds.pivot_state``): past it, an
    operator may not unwind it, and may retry it forward (``stateguard.lifecycle``). ``steps``
    and ``compensations``: the run's, when the caller read them already (the run page); else its
    pivot steps only are read, a query that returns no row for a run with no pivot, and its
    compensations only for a run past one."""
    if steps is None:
        rows = list(run.steps.filter(kind=kinds.StepKind.PIVOT).values_list(
            "step_id", "node", "status", "kind"))
    else:
        rows = [(s.step_id, s.node, s.status, s.kind) for s in steps
                if s.kind == kinds.StepKind.PIVOT]
    code = str(run.code)
    pivots = [StepRecord(code, step_id, node, status=StepStatus(status), kind=kind)
              for step_id, node, status, kind in rows]
    pivot = kinds.pivot_state(pivots)
    if pivot is None or pivot.in_doubt:
        return pivot
    # The web journal keeps one turn per run: any compensation is of this one.
    unwound = (run.compensations.exists() if compensations is None
               else any(True for _ in compensations))
    return replace(pivot, unwound=unwound)


class StepNotFound(LookupError):
    """A retry from a step the run has not (or no longer) in its saga; the message says which
    steps it has."""


@dataclass(frozen=True, slots=True)
class RunRewind:
    """What a retry of a run from one of its steps would do (``stateguard.rewind``), with what
    the rule needs to judge it (``lifecycle.Action.RETRY_FROM``)."""

    plan: rewind.Rewind
    undone: bool  # a step of the run was compensated already: it is partly undone
    state_keys: list[str] | None  # the keys an operator's update may name
    compensated: frozenset[str]  # of the steps to undo, the node names with a compensation


def run_rewind(*, run: Run, from_step: str) -> RunRewind:
    """What a retry of ``run`` from ``from_step`` (a step id, or a node's, tool's or task's
    name: its last run) would undo, newest first, and run again, read from the journal and the
    thread's checkpoints as the worker will read them. ``StepNotFound`` when the run has no
    such step; ``KeyError`` when its agent is not offered here."""
    guard, graph, _ = runtime.guard_for(run.agent)
    view = guard.status(run.thread_id)
    steps = rewind.live_steps(view.steps)
    named = sorted((s for s in steps if from_step in (s.step_id, s.node)),
                   key=lambda s: (s.step_id == from_step, s.started_at))
    if not named:
        nodes = sorted({s.node for s in steps})
        raise StepNotFound(f"run {run.code} has no step {from_step!r} to retry from; its "
                           f"steps are {nodes} (or a step id)")
    try:
        plan = rewind.plan_rewind(graph.get_state_history(runtime.config_for(run.thread_id)),
                                  steps, named[-1], run=str(run.code))
    except InvalidRunState as exc:
        raise StepNotFound(str(exc)) from None
    keys = getattr(graph, "stream_channels_list", None)
    spec = guard.core.spec
    return RunRewind(plan, rewind.undone(steps, view.compensations),
                     keys if isinstance(keys, list) else None,
                     frozenset(s.node for s in plan.undo
                               if spec.compensation_for(s.node, s.tags) is not None))


def run_get(*, code: str | uuid.UUID, detail: bool = False) -> Run:
    """The run ``code``, with its submitter (a run's summary names it). With ``detail``, on
    PostgreSQL, also everything ``run_detail`` shows, in the same query (``_detail_sql``):
    one query instead of seven."""
    try:
        code = uuid.UUID(str(code))
        if detail and connection.vendor == "postgresql":
            return _run_with_history(code)
        return Run.objects.select_related("submitted_by").get(code=code)
    except (ValueError, Run.DoesNotExist) as exc:
        raise RunNotFound(f"no run {code}") from exc


# A run id, or the start of one as the dashboard shows it (at least 4 hex digits).
_CODE_PREFIX = re.compile(r"[0-9a-fA-F-]{4,36}")


# The step and error type filters' value for "none on record" (runs.incidents.NONE).
NO_INCIDENT_KEY = "-"


def run_list(*, runs: QuerySet[Run], status: str | Sequence[str] | None = None,
             agent: str | None = None, q: str | None = None,
             created_after: datetime | None = None, created_before: datetime | None = None,
             node: str | None = None, what: str | None = None, step: str | None = None,
             error_type: str | None = None, sort: str = "-created") -> QuerySet[Run]:
    """``runs`` filtered, in the order ``sort`` names (``run_order``: newest first by
    default). ``status``: one, or any of several. ``q`` matches the start of the run id or
    any text in the input (case-insensitive). ``node`` (and ``what``, a key of
    ``agent_map.STOPS``): the runs that stand or stopped there, as an agent's map counts
    them. ``step`` and ``error_type``: where the run last failed and with what (an
    Incidents group's runs; ``NO_INCIDENT_KEY`` for none on record). Status and agent are
    served by the (status|agent, -created_at) indexes, the dates by (-created_at), ``node``
    by the status index and ``sagas_step_stopped``, a failed or needs-attention run's step
    and error type by ``sagas_run_incidents``; ``q`` on the input scans the runs the other
    filters leave (no text index: see docs/api.md). Each run comes with its
    ``run_duration`` as ``duration``."""
    if isinstance(status, str):
        status = [status]
    if status:
        runs = runs.filter(status__in=sorted(set(status)))
    if agent:
        runs = runs.filter(agent=agent)
    if node:
        runs = runs.filter(agent_map.stopped_at(node, what or ""))
    if step:
        runs = runs.filter(failed_node="" if step == NO_INCIDENT_KEY else step)
    if error_type:
        runs = runs.filter(error_type="" if error_type == NO_INCIDENT_KEY else error_type)
    if created_after:
        runs = runs.filter(created_at__gte=created_after)
    if created_before:
        runs = runs.filter(created_at__lt=created_before)
    if q:
        matches = Q(input_text__icontains=q)
        if _CODE_PREFIX.fullmatch(q):
            matches |= Q(code__istartswith=q)
        runs = runs.alias(input_text=Cast("input", TextField())).filter(matches)
    # The submitters of the rows read, in a query of their own: joined, wherever PostgreSQL
    # sorts instead of reading an order's index (a search, a filter no index serves with the
    # order), every run that matches was joined to its user and carried the user's columns
    # (a row 8 times as wide) through the sort, to keep 51 of them.
    return run_order(runs.prefetch_related("submitted_by").annotate(duration=run_duration()),
                     sort)


# What each of the list's orders sorts by, smallest first, ties newest first; "-x" is the
# exact reverse of "x", so that each is one index read forwards or backwards:
# (-created_at) for created, (-updated_at) for updated, (agent, -created_at) and
# (status, -created_at) for agent and status (an incremental sort on the id breaks ties of
# one instant), ``sagas_run_duration`` for duration (``run_duration``'s expression).
_ORDERS = {
    "created": ("created_at", "pk"),
    "updated": ("updated_at", "pk"),
    "agent": ("agent", "-created_at", "-pk"),
    "status": ("status", "-created_at", "-pk"),
    "duration": ("duration", "pk"),
}


def run_order(runs: QuerySet[Run], sort: str) -> QuerySet[Run]:
    """``runs`` (annotated with their ``run_duration`` as ``duration``) in the list's order
    ``sort`` (``filters.SORTS``); ``ValueError`` for another."""
    column, descending = sort.removeprefix("-"), sort.startswith("-")
    if column not in _ORDERS:
        raise ValueError(f"no order {sort!r}")
    fields = _ORDERS[column]
    if descending:
        fields = tuple(f.removeprefix("-") if f.startswith("-") else f"-{f}" for f in fields)
    return runs.order_by(*fields)


def approval_get(*, run: Run, pk: int) -> Approval:
    try:
        return run.approvals.get(pk=pk)
    except Approval.DoesNotExist:
        raise NotFound(f"run {run.code} has no approval {pk}") from None


def compensation_get(*, pk: int) -> Compensation:
    try:
        return Compensation.objects.select_related("run", "step").get(pk=pk)
    except Compensation.DoesNotExist:
        raise NotFound(f"no compensation {pk}") from None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


# How the core words a violation (stateguard.exceptions.InvariantViolation); the journal keeps
# the error's message, not the invariant's name on its own.
_VIOLATION = re.compile(r"invariant (['\"])(?P<name>.*?)\1 violated[^:]*: (?P<message>.*)", re.S)


# What run_detail shows of each relation of a run: its fields, in order, and which are times.
_STEP = ("node", "step_id", "status", "kind", "attempt", "started_at", "finished_at", "update",
         "error")
_ATTEMPT = ("number", "ok", "started_at", "finished_at", "result", "error")
_COMPENSATION = ("id", "node", "step_id", "status", "triggered_by", "idempotency_key",
                 "retry_at", "created_at", "updated_at")
_EFFECT = ("provider", "kind", "external_id", "amount", "currency", "status", "undoes", "node",
           "step_id", "recorded_at")
_APPROVAL = ("id", "node", "step_id", "payload", "status", "decided_by", "reason",
             "requested_at", "decided_at")
_AUDIT = ("created_at", "actor", "action", "data")
_TIMES = frozenset({"started_at", "finished_at", "created_at", "updated_at", "recorded_at",
                    "requested_at", "decided_at", "retry_at"})


def _history(run: Run) -> dict[str, QuerySet[Any]]:
    """Each relation ``run_detail`` shows of ``run``, in its order, as rows of values; a
    compensation's ``step_id`` is its step's (``step__step_id``). ``_detail_sql`` reads the
    same in one statement on PostgreSQL."""
    def rows(queryset: QuerySet[Any], fields: tuple[str, ...], *order: str,
             **columns: str) -> QuerySet[Any]:
        return queryset.order_by(*order).values(*(columns.get(f, f) for f in fields))

    return {
        "steps": rows(Step.objects.filter(run=run), _STEP, "started_at", "pk"),
        "compensations": rows(Compensation.objects.filter(run=run), _COMPENSATION, "created_at",
                              "pk", step_id="step__step_id"),
        "effects": rows(Effect.objects.filter(run=run), _EFFECT, "recorded_at", "pk"),
        "approvals": rows(Approval.objects.filter(run=run), _APPROVAL, "requested_at", "pk"),
        "audit": rows(AuditEvent.objects.filter(run=run), _AUDIT, "created_at", "pk"),
    }


def _json_rows(source: str, fields: tuple[str, ...], where: str, order: str,
               columns: dict[str, str] | None = None) -> str:
    """SQL for the rows of ``source`` that match ``where``, in ``order``, as an array of JSON
    objects: one key per field, its value the column of that name, or ``columns[field]``."""
    quote = connection.ops.quote_name  # "update" is a keyword
    pairs = ", ".join(f"'{f}', {(columns or {}).get(f, quote(f))}" for f in fields)
    return f"ARRAY(SELECT json_build_object({pairs}) FROM {source} WHERE {where} ORDER BY {order})"


@cache
def _detail_sql() -> str:
    """A run by its code, its submitter, and what ``run_detail`` shows of its relations as one
    JSON object of arrays (``_history``'s, in its orders). Plain SQL, made once per process:
    the ORM built and compiled this query anew on each call at ~25 times the CPU of running
    it (P6, docs/benchmarks.md); its text the same on every call, psycopg prepares it."""
    def table(model: type[Any]) -> str:
        return str(model._meta.db_table)

    attempts = _json_rows(table(CompensationAttempt), _ATTEMPT, "compensation_id = c.id",
                          "number")
    history = {
        "steps": _json_rows(table(Step), _STEP, "run_id = r.id", "started_at, id"),
        "compensations": _json_rows(
            f"{table(Compensation)} c JOIN {table(Step)} s ON s.id = c.step_id",
            (*_COMPENSATION, "attempts"), "c.run_id = r.id", "c.created_at, c.id",
            {**{f: f"c.{connection.ops.quote_name(f)}" for f in _COMPENSATION},
             "step_id": "s.step_id",
             "attempts": attempts}),
        "effects": _json_rows(table(Effect), _EFFECT, "run_id = r.id", "recorded_at, id"),
        "approvals": _json_rows(table(Approval), _APPROVAL, "run_id = r.id",
                                "requested_at, id"),
        "audit": _json_rows(table(AuditEvent), _AUDIT, "run_id = r.id", "created_at, id"),
    }
    as_json = ", ".join(f"'{name}', {rows}" for name, rows in history.items())
    user = get_user_model()
    return (f"SELECT {sql_rows.columns(Run, 'r')}, {sql_rows.columns(user, 'u')}, "
            f"json_build_object({as_json}) FROM {table(Run)} r "
            f"LEFT JOIN {table(user)} u ON u.id = r.submitted_by_id WHERE r.code = %s")


def _run_with_history(code: uuid.UUID) -> Run:
    with connection.cursor() as cursor:
        cursor.execute(_detail_sql(), [code])
        row = cursor.fetchone()
    if row is None:
        raise Run.DoesNotExist(f"no run {code}")
    (run, submitter), (history,) = sql_rows.read(row, Run, get_user_model())
    run.submitted_by = submitter
    run.detail_history = history
    return run


def _read_history(run: Run) -> dict[str, list[dict[str, Any]]]:
    """The run's relations as ``run_detail`` shows them: read with the run by
    ``run_get(detail=True)``, or now (another database, a run found otherwise)."""
    if hasattr(run, "detail_history"):
        return run.detail_history  # type: ignore[no-any-return]
    history = {name: list(rows) for name, rows in _history(run).items()}
    attempts: dict[int, list[dict[str, Any]]] = {}
    if history["compensations"]:
        for attempt in CompensationAttempt.objects.filter(compensation__run=run).order_by(
                "number").values("compensation_id", *_ATTEMPT):
            attempts.setdefault(attempt.pop("compensation_id"), []).append(attempt)
    for comp in history["compensations"]:
        comp["step_id"] = comp.pop("step__step_id")
        comp["attempts"] = attempts.get(comp["id"], [])
    return history


def _shown(row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A row as run_detail shows it: its fields, times in ISO 8601 as Python writes them
    (those read as JSON come as PostgreSQL wrote them)."""
    out = {}
    for f in fields:
        value = row[f]
        if f in _TIMES and value is not None:
            value = (datetime.fromisoformat(value) if isinstance(value, str) else value
                     ).isoformat()
        out[f] = value
    return out


def _violated_invariant(run: Run, steps: list[Step] | list[dict[str, Any]]
                        ) -> dict[str, Any] | None:
    """The invariant that stopped the run: the violated step's (the node whose writes broke
    it), or the run's error when it broke on the final state (no one node to blame). The steps
    are rows (``run_detail``'s) or ``Step`` objects (the dashboard's run page)."""
    rows = [s if isinstance(s, dict) else {"node": s.node, "status": s.status, "error": s.error}
            for s in steps]
    found = [(s["node"], s["error"]) for s in rows
             if s["status"] == Step.Status.VIOLATED and s["error"]]
    if not found and run.error and run.error.get("type") == "InvariantViolation":
        found = [(None, run.error)]
    if not found:
        return None
    node, error = found[-1]
    text = str(error.get("message", ""))
    match = _VIOLATION.match(text)
    return {"node": node, "name": match["name"] if match else None,
            "message": match["message"] if match else text}


def _request(run: Run) -> dict[str, Any] | None:
    """The operator's request a worker has yet to carry out, while it still fits the run."""
    if run.waiting_request is None or not run.request:
        return None
    return {"id": run.request.get("id"), "action": run.request.get("action"),
            "by": run.request.get("by"), "requested_at": _iso(run.requested_at),
            **{k: run.request[k] for k in ("from_step", "node", "update") if k in run.request}}


def run_summary(*, run: Run) -> dict[str, Any]:
    """The run without its steps and history: what a list shows and an action returns."""
    return {
        "code": str(run.code), "agent": run.agent, "status": run.status, "input": run.input,
        "error": run.error, "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "submitted_by": run.submitted_by.get_username() if run.submitted_by else None,
        "request": _request(run),
        "version": version_json(versions.of(run)),
    }


def agent_versions(*, runs: QuerySet[Run], agent: str) -> list[dict[str, Any]]:
    """Each version of ``agent`` with how many of ``runs`` are not finished on it
    (``versions.live_counts``); ``NotFound`` for an agent neither offered nor with runs."""
    counts = versions.live_counts(runs, agent=agent)
    if not counts:
        raise NotFound(f"no agent {agent!r}: GET /api/agents lists them")
    return [{**(version_json(c.version) or {}), "state": c.state, "live": c.live}
            for c in counts]


def version_json(version: versions.Version | None) -> dict[str, str] | None:
    """An agent version as the API and pages show it."""
    if version is None:
        return None
    return {"version": version.version, "graph_digest": version.digest,
            "label": version.label}


def run_detail(*, run: Run) -> dict[str, Any]:
    """The run with its steps, compensations (and every attempt), effects (the ledger),
    approvals, the violated invariant if any and the audit trail, as JSON data. A run from
    ``run_get(detail=True)`` has them already (PostgreSQL); another is read here."""
    history = _read_history(run)
    steps = [_shown(s, _STEP) for s in history["steps"]]
    compensations = [{**_shown(c, _COMPENSATION),
                      "attempts": [_shown(a, _ATTEMPT) for a in c["attempts"]]}
                     for c in history["compensations"]]
    undo = {c["step_id"]: c["status"] for c in compensations}
    return {
        **run_summary(run=run),
        "lease": {"owner": run.lease_owner or None,
                  "expires_at": _iso(run.lease_expires_at),
                  "fencing_token": run.fencing_token},
        "steps": steps,
        "compensations": compensations,
        # The ledger: what the run did to the world (charges, refunds) and whether it is
        # undone, in the ledger's word for it as the run page and the admin say it.
        "effects": [{**(e := _shown(row, _EFFECT)), "undoes": e["undoes"] or None,
                     "state": ledger.state_of(e["status"], e["undoes"] or None,
                                              undo.get(e["step_id"]))}
                    for row in history["effects"]],
        "approvals": [{**(a := _shown(row, _APPROVAL)), "decided_by": a["decided_by"] or None}
                      for row in history["approvals"]],
        "violated_invariant": _violated_invariant(run, steps),
        "audit": [{"at": e["created_at"], "actor": e["actor"], "action": e["action"],
                   "data": e["data"]}
                  for e in (_shown(row, _AUDIT) for row in history["audit"])],
    }


def agent_list() -> list[dict[str, Any]]:
    """The agents this deployment offers: name, description, nodes (in the order they were
    added), the tools its ``ToolNode``s can call, the nodes and tools that have a compensation
    (by name or by tag), the approval gates and the JSON schema of the input."""
    agents = []
    for name in runtime.agent_names():
        spec = runtime.agent_spec(name)
        graph_nodes = spec.build().nodes
        nodes = {node: node_tags(ns.metadata) for node, ns in graph_nodes.items()}
        tools = tools_of(tool_nodes({n: ns.runnable for n, ns in graph_nodes.items()}))
        keyed = {**nodes, **tools}  # a compensation names a node, a tool, or one's tag
        agents.append({
            "name": name, "description": spec.description, "nodes": list(nodes),
            "tools": list(tools),
            "compensated": [n for n, tags in keyed.items()
                            if n in spec.compensations
                            or any(t in spec.compensations for t in tags)],
            "approvals": list(spec.approvals),
            "input_schema": spec.input_schema.model_json_schema(),
        })
    return agents
