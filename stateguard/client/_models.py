"""What the API answers, as dataclasses (docs/api.md describes each field).

Each is made from the API's JSON by ``from_json``; a field the server adds later is ignored,
so an older client keeps working against a newer server. Statuses are strings, the values of
``stateguard.RunStatus`` (``"compensated"``...) and its siblings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stateguard.records import ErrorInfo


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value))


def _maybe_time(value: Any) -> datetime | None:
    return None if value is None else _time(value)


def _error(value: Any) -> ErrorInfo | None:
    if not value:
        return None
    return ErrorInfo(str(value.get("type", "")), str(value.get("message", "")),
                     str(value.get("traceback", "")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """An operator's request that waits for a worker (``Run.request``)."""

    id: str | None
    action: str | None
    by: str | None
    requested_at: datetime | None
    from_step: str | None = None
    node: str | None = None
    update: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Request:
        return cls(id=data.get("id"), action=data.get("action"), by=data.get("by"),
                   requested_at=_maybe_time(data.get("requested_at")),
                   from_step=data.get("from_step"), node=data.get("node"),
                   update=data.get("update"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """A run, as every operation returns it. ``replayed``: ``submit`` gave back the run an
    earlier submission with the same idempotency key made (the API's 200, not 201)."""

    code: str
    agent: str
    status: str
    input: dict[str, Any]
    error: ErrorInfo | None
    submitted_by: str | None
    created_at: datetime
    updated_at: datetime
    request: Request | None
    replayed: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any], *, replayed: bool = False) -> Run:
        return cls(**_run_fields(data), replayed=replayed)


def _run_fields(data: dict[str, Any]) -> dict[str, Any]:
    request = data.get("request")
    return {"code": str(data["code"]), "agent": data["agent"], "status": data["status"],
            "input": data.get("input") or {}, "error": _error(data.get("error")),
            "submitted_by": data.get("submitted_by"), "created_at": _time(data["created_at"]),
            "updated_at": _time(data["updated_at"]),
            "request": Request.from_json(request) if request else None}


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    node: str
    step_id: str
    status: str  # started, paused, succeeded, failed, violated, rewound
    kind: str
    attempt: int
    started_at: datetime
    finished_at: datetime | None
    update: Any
    error: ErrorInfo | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(node=data["node"], step_id=data["step_id"], status=data["status"],
                   kind=data.get("kind", "compensatable"), attempt=data["attempt"],
                   started_at=_time(data["started_at"]),
                   finished_at=_maybe_time(data.get("finished_at")), update=data.get("update"),
                   error=_error(data.get("error")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    number: int
    ok: bool
    started_at: datetime
    finished_at: datetime
    result: str
    error: ErrorInfo | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        return cls(number=data["number"], ok=data["ok"], started_at=_time(data["started_at"]),
                   finished_at=_time(data["finished_at"]), result=data.get("result", ""),
                   error=_error(data.get("error")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Compensation:
    id: int
    node: str
    step_id: str
    status: str  # running, succeeded, nothing_to_undo, failed, skipped_in_doubt, waiting
    triggered_by: str
    idempotency_key: str
    retry_at: datetime | None
    created_at: datetime
    updated_at: datetime
    attempts: list[Attempt]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Compensation:
        return cls(id=data["id"], node=data["node"], step_id=data["step_id"],
                   status=data["status"], triggered_by=data["triggered_by"],
                   idempotency_key=data["idempotency_key"],
                   retry_at=_maybe_time(data.get("retry_at")),
                   created_at=_time(data["created_at"]), updated_at=_time(data["updated_at"]),
                   attempts=[Attempt.from_json(a) for a in data.get("attempts", [])])


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """An entry of the run's effect ledger (a Stripe charge, a refund...)."""

    provider: str
    kind: str
    external_id: str
    amount: int | None
    currency: str
    status: str  # applied, partially_compensated, compensated
    # What the ledger can vouch for: the status, "undoes", or "in_doubt" (docs/api.md).
    state: str
    undoes: str | None
    node: str
    recorded_at: datetime

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Effect:
        return cls(provider=data["provider"], kind=data["kind"],
                   external_id=data["external_id"], amount=data.get("amount"),
                   currency=data.get("currency", ""), status=data["status"],
                   # A server from before the field says the status alone.
                   state=data.get("state", data["status"]),
                   undoes=data.get("undoes"), node=data["node"],
                   recorded_at=_time(data["recorded_at"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    id: int
    node: str
    step_id: str
    payload: Any
    status: str  # pending, approved, rejected
    decided_by: str | None
    reason: str
    requested_at: datetime
    decided_at: datetime | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        return cls(id=data["id"], node=data["node"], step_id=data["step_id"],
                   payload=data.get("payload"), status=data["status"],
                   decided_by=data.get("decided_by"), reason=data.get("reason", ""),
                   requested_at=_time(data["requested_at"]),
                   decided_at=_maybe_time(data.get("decided_at")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Invariant:
    """The invariant that stopped a run; ``node`` None when it broke on the final state."""

    name: str | None
    node: str | None
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    at: datetime
    actor: str
    action: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunDetail(Run):
    """A run with its steps, compensations (every attempt), effects, approvals, the violated
    invariant if any, and its audit trail (``get``, ``wait``)."""

    steps: list[Step]
    compensations: list[Compensation]
    effects: list[Effect]
    approvals: list[Approval]
    violated_invariant: Invariant | None
    audit: list[AuditEntry]

    @classmethod
    def from_json(cls, data: dict[str, Any], *, replayed: bool = False) -> RunDetail:
        invariant = data.get("violated_invariant")
        return cls(
            **_run_fields(data), replayed=replayed,
            steps=[Step.from_json(s) for s in data.get("steps", [])],
            compensations=[Compensation.from_json(c) for c in data.get("compensations", [])],
            effects=[Effect.from_json(e) for e in data.get("effects", [])],
            approvals=[Approval.from_json(a) for a in data.get("approvals", [])],
            violated_invariant=Invariant(name=invariant.get("name"), node=invariant.get("node"),
                                         message=invariant.get("message", ""))
            if invariant else None,
            audit=[AuditEntry(at=_time(e["at"]), actor=e["actor"], action=e["action"],
                              data=e.get("data") or {}) for e in data.get("audit", [])])

    @property
    def pending_approvals(self) -> list[Approval]:
        return [a for a in self.approvals if a.status == "pending"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPage:
    """A page of ``list``: the runs on it, newest first, and how many match in all."""

    items: list[Run]
    count: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunPage:
        return cls(items=[Run.from_json(r) for r in data["items"]], count=data["count"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    """An agent the deployment offers (``agents``)."""

    name: str
    description: str
    nodes: list[str]
    tools: list[str]
    compensated: list[str]
    approvals: list[str]
    input_schema: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Agent:
        return cls(name=data["name"], description=data.get("description", ""),
                   nodes=data.get("nodes", []), tools=data.get("tools", []),
                   compensated=data.get("compensated", []),
                   approvals=data.get("approvals", []),
                   input_schema=data.get("input_schema", {}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One of a run's events (``events``): ``type`` is ``step.started``, ``step.succeeded``,
    ``step.failed``, ``invariant.violated``, ``step.rewound``, ``approval.requested``,
    ``approval.decided``, ``compensation.attempt``, ``compensation.succeeded``,
    ``compensation.failed``, ``compensation.waiting`` or ``run.status`` (``data["status"]``);
    ``id`` is what to resume after (``events(code, last_event_id=...)``)."""

    id: str
    type: str
    run: str
    node: str | None
    step_id: str | None
    data: dict[str, Any]
    at: datetime

    @classmethod
    def from_json(cls, id: str, data: dict[str, Any]) -> Event:
        return cls(id=id, type=data["type"], run=str(data["run"]), node=data.get("node"),
                   step_id=data.get("step_id"), data=data.get("data") or {},
                   at=datetime.fromtimestamp(float(data["at"]), tz=UTC))

    @property
    def status(self) -> str | None:
        """A ``run.status`` event's status (None for the others)."""
        return self.data.get("status") if self.type == "run.status" else None
