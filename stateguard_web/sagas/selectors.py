"""Reads of the saga journal for views, the API and management commands."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

from stateguard.instrument import node_tags
from stateguard_web.sagas import runtime
from stateguard_web.sagas.models import Approval, Compensation, Run, Step


class RunNotFound(LookupError):
    pass


class NotFound(LookupError):
    """No such approval or compensation (where the caller may look)."""


def run_get(*, code: str | uuid.UUID) -> Run:
    try:
        # With its submitter: a run's summary names it (one query fewer per API read).
        return Run.objects.select_related("submitted_by").get(code=uuid.UUID(str(code)))
    except (ValueError, Run.DoesNotExist) as exc:
        raise RunNotFound(f"no run {code}") from exc


# A run id, or the start of one as the dashboard shows it (at least 4 hex digits).
_CODE_PREFIX = re.compile(r"[0-9a-fA-F-]{4,36}")


def run_list(*, runs: QuerySet[Run], status: str | None = None, agent: str | None = None,
             q: str | None = None, created_after: datetime | None = None,
             created_before: datetime | None = None) -> QuerySet[Run]:
    """``runs`` filtered, newest first. ``q`` matches the start of the run id or any text in
    the input (case-insensitive). Status and agent are served by the (status|agent,
    -created_at) indexes, the dates by (-created_at); ``q`` on the input scans the runs the
    other filters leave (no text index: see docs/api.md)."""
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if created_after:
        runs = runs.filter(created_at__gte=created_after)
    if created_before:
        runs = runs.filter(created_at__lt=created_before)
    if q:
        matches = Q(input_text__icontains=q)
        if _CODE_PREFIX.fullmatch(q):
            matches |= Q(code__istartswith=q)
        runs = runs.alias(input_text=Cast("input", TextField())).filter(matches)
    return runs.select_related("submitted_by").order_by("-created_at", "-pk")


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


def _violated_invariant(run: Run, steps: list[Step]) -> dict[str, Any] | None:
    """The invariant that stopped the run: the violated step's (the node whose writes broke
    it), or the run's error when it broke on the final state (no one node to blame)."""
    found = [(s.node, s.error) for s in steps if s.status == Step.Status.VIOLATED and s.error]
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
            "by": run.request.get("by"), "requested_at": _iso(run.requested_at)}


def run_summary(*, run: Run) -> dict[str, Any]:
    """The run without its steps and history: what a list shows and an action returns."""
    return {
        "code": str(run.code), "agent": run.agent, "status": run.status, "input": run.input,
        "error": run.error, "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "submitted_by": run.submitted_by.get_username() if run.submitted_by else None,
        "request": _request(run),
    }


def run_detail(*, run: Run) -> dict[str, Any]:
    """The run with its steps, compensations (and every attempt), effects (the ledger),
    approvals, the violated invariant if any and the audit trail, as JSON data."""
    steps = list(run.steps.order_by("started_at", "pk"))
    comps = run.compensations.select_related("step").prefetch_related("attempts")
    return {
        **run_summary(run=run),
        "lease": {"owner": run.lease_owner or None,
                  "expires_at": _iso(run.lease_expires_at),
                  "fencing_token": run.fencing_token},
        "steps": [{"node": s.node, "step_id": s.step_id, "status": s.status,
                   "attempt": s.attempt, "started_at": s.started_at.isoformat(),
                   "finished_at": _iso(s.finished_at), "update": s.update, "error": s.error}
                  for s in steps],
        "compensations": [{"id": c.pk, "node": c.node, "step_id": c.step.step_id,
                           "status": c.status, "triggered_by": c.triggered_by,
                           "idempotency_key": c.idempotency_key,
                           "created_at": c.created_at.isoformat(),
                           "updated_at": c.updated_at.isoformat(),
                           "attempts": [{"number": a.number, "ok": a.ok,
                                         "started_at": a.started_at.isoformat(),
                                         "finished_at": a.finished_at.isoformat(),
                                         "result": a.result, "error": a.error}
                                        for a in c.attempts.all()]}
                          for c in comps],
        # The ledger: what the run did to the world (charges, refunds) and whether it is undone.
        "effects": [{"provider": e.provider, "kind": e.kind, "external_id": e.external_id,
                     "amount": e.amount, "currency": e.currency, "status": e.status,
                     "undoes": e.undoes or None, "node": e.node,
                     "recorded_at": e.recorded_at.isoformat()}
                    for e in run.effects.order_by("recorded_at", "pk")],
        "approvals": [{"id": a.pk, "node": a.node, "step_id": a.step_id, "payload": a.payload,
                       "status": a.status, "decided_by": a.decided_by or None,
                       "reason": a.reason, "requested_at": a.requested_at.isoformat(),
                       "decided_at": _iso(a.decided_at)}
                      for a in run.approvals.order_by("requested_at", "pk")],
        "violated_invariant": _violated_invariant(run, steps),
        "audit": [{"at": e.created_at.isoformat(), "actor": e.actor, "action": e.action,
                   "data": e.data}
                  for e in run.audit_events.order_by("created_at", "pk")],
    }


def agent_list() -> list[dict[str, Any]]:
    """The agents this deployment offers: name, description, nodes (in the order they were
    added), the nodes that have a compensation (by name or by tag), the approval gates and
    the JSON schema of the input."""
    agents = []
    for name in runtime.agent_names():
        spec = runtime.agent_spec(name)
        nodes = {node: node_tags(ns.metadata) for node, ns in spec.build().nodes.items()}
        agents.append({
            "name": name, "description": spec.description, "nodes": list(nodes),
            "compensated": [n for n, tags in nodes.items()
                            if n in spec.compensations
                            or any(t in spec.compensations for t in tags)],
            "approvals": list(spec.approvals),
            "input_schema": spec.input_schema.model_json_schema(),
        })
    return agents
