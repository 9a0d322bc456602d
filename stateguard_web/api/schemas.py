"""The API's In and Out schemas. Outs are built from the selectors' JSON data; Ins refuse
unknown fields, NUL characters (PostgreSQL cannot store them) and endless strings, each with
a 422 that names the field."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StringConstraints,
    field_validator,
    model_validator,
)

from stateguard.effects import EffectStatus
from stateguard.kinds import StepKind
from stateguard.records import ApprovalStatus, CompensationStatus, RunStatus, StepStatus
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import Batch, BatchItem

MAX_TEXT = 2000  # reasons and notes (services refuse longer ones too)
MAX_ID = 2**63 - 1  # the database's bigint: a larger id cannot exist


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _nul_free(value: Any) -> Any:
    """Refuse NUL anywhere in a JSON value, keys too (iteratively; depth is limited earlier)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _no_nul(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must be printable characters")
    return value


def _text(max_length: int, min_length: int = 0) -> Any:
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length),
                     AfterValidator(_no_nul)]


AgentName = _text(100, 1)
Reason = _text(MAX_TEXT)
Note = _text(MAX_TEXT, 1)
Search = _text(200, 1)
StepName = _text(300, 1)  # a step's id, or a node's name
NodeName = _text(200, 1)  # a node's or a tool's name (Run.failed_node's length)
ErrorType = _text(200, 1)  # Run.error_type's length
# runs.agent_map.STOPS and WINDOWS, as the schema lists them (a test checks they agree).
Stopped = Literal["now", "waiting", "failed", "compensated"]
Window = Literal["1h", "24h", "7d"]
# What services.run_submit accepts as a key: 1 to 200 printable characters.
IdempotencyKey = Annotated[str, StringConstraints(min_length=1, max_length=200),
                           AfterValidator(_printable)]

# GET /api/runs/{code}/events's Last-Event-ID: an id that stream sent (runs.journal_events
# says what makes one; these bound it before it is parsed).
EventId = Annotated[str, StringConstraints(min_length=1, max_length=700),
                    AfterValidator(_printable)]


class In(BaseModel):
    """A request's body. Unknown fields are refused. A plain pydantic model, as the Outs are:
    ninja's ``Schema`` validates a model that forbids extra fields twice (once as given, once
    behind its ``DjangoGetter``)."""

    model_config = ConfigDict(extra="forbid")


class RunIn(In):
    agent: AgentName = Field(description="an agent's name, as GET /api/agents lists them")
    input: dict[str, Any] = Field(default_factory=dict,
                                  description="the agent's input (its input_schema)")
    idempotency_key: IdempotencyKey | None = Field(
        None, description="or the Idempotency-Key header: the same key again gives back the "
                          "same run (200) instead of a second one")
    webhook_url: str | None = Field(
        None, max_length=2000,
        description="where to POST the run's events (it ends, or waits for an approval), "
                    "signed with the API key's webhook secret; default: the key's default URL")

    @field_validator("agent")
    @classmethod
    def _offered(cls, value: str) -> str:
        names = runtime.agent_names()
        if value not in names:
            raise ValueError(f"unknown agent {value!r}; agents: {', '.join(names)}")
        return value

    @field_validator("input")
    @classmethod
    def _input_nul_free(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _nul_free(value)  # type: ignore[no-any-return]


class DecisionIn(In):
    approval: int = Field(ge=1, le=MAX_ID, description="the approval's id (the run's detail "
                                                       "lists them)")
    reason: Reason = ""


class CompensateIn(In):
    reason: Reason = ""


class TerminateIn(In):
    then: Literal["unwind", "hold"] = Field(
        description="once the run stopped: unwind it (its compensations, newest first) or "
                    "hold it needs_attention, nothing undone")
    reason: Reason = Field("", description="kept in the audit trail and the run's error")


class RetryIn(In):
    from_step: StepName | None = Field(
        None, description="retry from this earlier step (a step id, or a node's name: its "
                          "last run): it and the steps after it are undone first, newest "
                          "first; without it, the run resumes from where it failed")
    update: dict[str, Any] | None = Field(
        None, description="with from_step: values of the agent's state to set before the "
                          "step runs again (its state's keys only)")

    @field_validator("update")
    @classmethod
    def _update_nul_free(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _nul_free(value)  # type: ignore[no-any-return]


class ResolveIn(In):
    note: Note = Field(description="what was done by hand")

    @field_validator("note")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("say what was done by hand")
        return value


def _not_a_number(value: Any) -> Any:
    """pydantic also reads a number as seconds since 1970: ``created_after=2024`` would have
    meant 1970-01-01T00:33:44Z, and every run. A time here is ISO 8601 only."""
    try:
        float(value)
    except (TypeError, ValueError):
        return value
    raise ValueError("must be an ISO 8601 date and time (2024-05-01T12:00:00Z), not a number")


def _utc(value: datetime | None) -> datetime | None:
    """A time without an offset is UTC; one the database cannot hold is refused."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range") from None


Time = Annotated[datetime, BeforeValidator(_not_a_number), AfterValidator(_utc)]


class RunFilters(Schema):
    """The runs list's filters: GET /api/runs's query, a batch's filter."""

    status: RunStatus | None = None
    agent: AgentName | None = None
    q: Search | None = Field(None, description="the start of a run id, or text in the "
                                                  "input (case-insensitive)")
    created_after: Time | None = Field(None, description="ISO 8601; UTC if no offset")
    created_before: Time | None = None
    node: NodeName | None = Field(None, description="runs that stand or stopped at this node "
                                                    "or tool, as an agent's map counts them")
    what: Stopped | None = Field(None, description="with `node`: how they stand or stopped "
                                                   "there (any, if absent)")
    step: NodeName | None = Field(None, description="where the run last failed (its step's "
                                                    "node), as GET /api/incidents groups "
                                                    "runs; - for none on record")
    error_type: ErrorType | None = Field(None, description="the type of the run's error when "
                                                           "it last failed "
                                                           "(APIConnectionError); - for none")


# runs.filters.SORTS and RANGES, as the schema lists them (a test checks they agree).
RunSort = Literal["-created", "created", "-updated", "updated", "-duration", "duration",
                  "-agent", "agent", "-status", "status"]
CreatedRange = Literal["1h", "24h", "7d", "30d", "custom"]


class RunFilter(RunFilters):
    """GET /api/runs's query: the dashboard's runs list's and its CSV export's too
    (``runs.filters``, which reads it for all three)."""

    # Several here, one in a batch's filter.
    status: list[RunStatus] | None = Field(  # type: ignore[assignment]
        None, description="any of these: `?status=failed&status=needs_attention`")
    sort: RunSort = Field("-created", description="the order: a column, `-` first for the "
                                                   "largest (newest, longest) first; ties "
                                                   "newest first")
    range: CreatedRange | None = Field(None, description="created in the last hour, 24 "
                                                         "hours, 7 or 30 days; or custom: "
                                                         "from `after` to `before`")
    after: date | None = Field(None, description="with range=custom: the first day "
                                                 "(YYYY-MM-DD), in `tz`")
    before: date | None = Field(None, description="with range=custom: the last day, "
                                                  "inclusive")
    tz: str | None = Field(None, max_length=64, description="the days' time zone "
                                                            "(Europe/Paris); UTC if absent")
    limit: int = Field(50, ge=1, le=200)
    offset: int = Field(0, ge=0, le=2**31 - 1)


class Out(BaseModel):
    """An answer, validated from the selectors' JSON data (dicts and lists). A plain pydantic
    model, not ninja's ``Schema``: that one's wrap validator puts every object it validates,
    each nested dict included, behind a ``DjangoGetter`` for attribute and ORM access, which
    none of these need (a run's detail has ~20 nested objects: a fifth of the time to answer
    it went there, P6 in docs/benchmarks.md)."""


class ErrorInfoOut(Out):
    type: str = ""
    message: str = ""
    traceback: str = ""


class RequestOut(Out):
    id: str | None
    action: str | None
    by: str | None
    requested_at: datetime | None
    # A retry from an earlier step ("retry_from"): the step (its id and node) and the update.
    from_step: str | None = None
    node: str | None = None
    update: dict[str, Any] | None = None


class VersionOut(Out):
    version: str = Field(description="what the agent declares (\"\" if nothing)")
    graph_digest: str = Field(description="16 hex digits of its graph's nodes and edges")
    label: str = Field(description="how the dashboard names it: v4, or the digest's start")


class AgentVersionOut(VersionOut):
    state: Literal["current", "draining", "gone"] = Field(
        description="current: new runs start on it; draining: kept registered for the runs "
                    "that started on it; gone: no longer registered (its runs are held)")
    live: int = Field(description="its runs not finished (neither succeeded nor compensated) "
                                  "that the caller may see: a draining version with none can "
                                  "go")


class RunOut(Out):
    code: uuid.UUID
    agent: str
    status: RunStatus
    input: dict[str, Any]
    error: ErrorInfoOut | None
    submitted_by: str | None
    created_at: datetime
    updated_at: datetime
    request: RequestOut | None = Field(description="an operator's request waiting for a "
                                                   "worker; others are refused until it "
                                                   "is carried out")
    version: VersionOut | None = Field(description="the version of its agent the run was "
                                                   "submitted on, and goes on on (null: "
                                                   "submitted before versions were recorded)")


class RunListOut(Out):
    items: list[RunOut]
    count: int


class StepOut(Out):
    node: str
    step_id: str
    status: StepStatus
    kind: StepKind = Field(description="its saga kind: compensatable steps are undone when the "
                                       "run unwinds; once a pivot succeeded, nothing is "
                                       "undone; retriable steps are retried")
    attempt: int
    started_at: datetime
    finished_at: datetime | None
    update: Any = Field(description="what the node wrote")
    error: ErrorInfoOut | None


class AttemptOut(Out):
    number: int
    ok: bool
    started_at: datetime
    finished_at: datetime
    result: str
    error: ErrorInfoOut | None


class CompensationOut(Out):
    id: int
    node: str
    step_id: str
    status: CompensationStatus
    triggered_by: str
    idempotency_key: str
    retry_at: datetime | None = Field(description="a waiting compensation's next round of "
                                                  "attempts; null in every other status")
    created_at: datetime
    updated_at: datetime
    attempts: list[AttemptOut]


class EffectOut(Out):
    provider: str
    kind: str = Field(description="charge, refund, ...")
    external_id: str = Field(description="the provider's id (a Stripe PaymentIntent, refund)")
    amount: int | None = Field(description="in the currency's smallest unit (cents)")
    currency: str
    status: EffectStatus
    state: Literal["applied", "partially_compensated", "compensated", "undoes", "in_doubt"] = (
        Field(description="what the ledger can vouch for: `status`, or `undoes` for an effect "
                          "that undid another, or `in_doubt` when the undo of the step that "
                          "made it was tried and did not record undoing it (it failed, waits, "
                          "runs, or found nothing): the provider may have it or not until "
                          "`manage.py reconcile_effects` asks it"))
    undoes: str | None = Field(description="the external id of the effect this one undoes "
                                           "(a refund's charge)")
    node: str
    step_id: str = Field(description="the step that made it, or whose undo made it")
    recorded_at: datetime


class ApprovalOut(Out):
    id: int
    node: str
    step_id: str
    payload: Any
    status: ApprovalStatus
    decided_by: str | None
    reason: str
    requested_at: datetime
    decided_at: datetime | None


class InvariantOut(Out):
    name: str | None
    node: str | None = Field(description="the node after whose writes it failed; null when "
                                         "it failed on the final state")
    message: str


class AuditOut(Out):
    at: datetime
    actor: str
    action: str
    data: dict[str, Any]


class RunDetailOut(RunOut):
    steps: list[StepOut]
    compensations: list[CompensationOut]
    effects: list[EffectOut]
    approvals: list[ApprovalOut]
    violated_invariant: InvariantOut | None
    audit: list[AuditOut]


class TimelineAttemptOut(Out):
    number: int
    ok: bool
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    summary: str = Field(description="its result, or its error in one line")


class TimelineBarOut(Out):
    group: Literal["model", "steps", "tools", "approvals", "compensations"] = Field(
        description="model: the model's turns (an AI run); tools: its tool calls")
    lane: int = Field(description="its lane in its group, from 0: bars that overlapped in "
                                  "time (ran at once) are on different lanes")
    kind: Literal["model", "step", "tool_call", "approval", "compensation"]
    name: str = Field(description="the node or tool; of an approval, the gated node; of a "
                                  "compensation, the node it undoes")
    status: str = Field(description="the journal's status of the step, approval or "
                                    "compensation; a step that started and never finished "
                                    "while no worker runs it: in_doubt")
    step_id: str
    started_at: datetime
    finished_at: datetime | None = Field(description="null while it is not over (or, in "
                                                     "doubt, never known)")
    duration_ms: float = Field(description="to finished_at; for a bar not over, to now (or, "
                                           "in doubt, to the next thing the run did)")
    detail: str = Field(description="what the model asked for, the error, who decided, ...")
    attempts: list[TimelineAttemptOut] = Field(description="a compensation's attempts")


class TimelineOut(Out):
    code: uuid.UUID
    status: RunStatus
    started_at: datetime = Field(description="the run's submission: where the timeline starts")
    ends_at: datetime = Field(description="now while the run goes on, else its last time")
    ticking: bool = Field(description="the run goes on (or waits): open bars grow")
    duration_ms: float
    queued_ms: float = Field(description="from the submission to the first step")
    totals_ms: dict[str, float] = Field(description="per group, the time covered by its bars "
                                                    "(overlaps counted once)")
    lanes: dict[str, int] = Field(description="per group, its lanes: how many of its bars ran "
                                              "at once, at most")
    bars: list[TimelineBarOut] = Field(description="by group, then start")


EventType = Literal[
    "step.started", "step.succeeded", "step.failed", "invariant.violated", "step.rewound",
    "approval.requested", "approval.decided", "compensation.attempt",
    "compensation.succeeded", "compensation.failed", "compensation.waiting", "run.status"]


class EventOut(Out):
    """One of a run's events (GET /api/runs/{code}/events): the JSON of an SSE event's
    ``data``, in the dashboard's websocket's shape (runs/journal_events.py)."""

    type: EventType
    run: uuid.UUID
    node: str | None = Field(description="the step's node or tool; null for run.status")
    step_id: str | None
    data: dict[str, Any] = Field(description="what happened: a step's attempt and error, an "
                                             "approval's id and decision, a compensation's "
                                             "attempt, the run's status...")
    at: float = Field(description="when, by the journal: seconds since 1970 (UTC)")

    @classmethod
    def sse_schema(cls) -> dict[str, Any]:
        """An SSE event of the stream, for the OpenAPI schema (before 3.2, ``schema``
        describes each event): its ``data`` is this model's JSON."""
        return {"type": "object", "required": ["data", "event", "id"], "properties": {
            "id": {"type": "string", "description": "resume after this event: send it as "
                                                    "Last-Event-ID"},
            "event": {"type": "string", "enum": list(EventType.__args__)},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": cls.model_json_schema()}}}


class AgentOut(Out):
    name: str
    description: str
    nodes: list[str]
    tools: list[str] = Field(description="the tools its agent's model can call (each call a step)")
    compensated: list[str] = Field(description="the nodes and tools that have a compensation")
    approvals: list[str] = Field(
        description="the nodes, tools or tags gated by an operator's approval")
    input_schema: dict[str, Any] = Field(description="the JSON schema of the input")


class MapNodeOut(Out):
    name: str = Field(description="a node of the agent's graph, or a tool")
    tool_of: str | None = Field(description="for a tool: the tools node its calls run in")
    now: int = Field(description="runs running with this node's step started")
    waiting: int = Field(description="runs paused for an approval at this node")
    failed: int = Field(description="runs failed or needing attention, stopped here (a step "
                                    "failed, broke an invariant or was cut off in doubt, or "
                                    "its approval was rejected)")
    compensated: int = Field(description="runs compensating or compensated, stopped here")
    failure_share: float = Field(description="(failed + compensated) / runs")


class AgentMapOut(Out):
    agent: str
    window: Window
    since: datetime = Field(description="the window's start: runs created since are counted")
    runs: int = Field(description="the agent's runs created in the window (that the caller "
                                  "may see)")
    nodes: list[MapNodeOut] = Field(description="in the graph's order, each tools node "
                                                "followed by its tools")


class BatchFilterIn(RunFilters):
    """GET /api/runs's filters, without paging: the runs they match when the batch is made."""

    model_config = ConfigDict(extra="forbid")


class BatchIn(In):
    action: Batch.Action = Field(description="retry (failed runs), compensate, or "
                                             "retry_compensations (the failed compensations "
                                             "of runs that need attention)")
    runs: list[uuid.UUID] | None = Field(
        None, min_length=1, max_length=10_000,
        description="the runs, by code, in the order to act on them (or filter)")
    filter: BatchFilterIn | None = Field(
        None, description="or every run that matches these filters now; {} for every run")
    reason: Reason = Field("", description="passed to each compensation request")
    dry_run: bool = Field(False, description="only say how many runs of which statuses the "
                                             "batch would touch (200); store nothing")

    @model_validator(mode="after")
    def _one_selection(self) -> BatchIn:
        if (self.runs is None) == (self.filter is None):
            raise ValueError("give runs or filter (one of the two)")
        return self


class BatchCountsOut(Out):
    pending: int
    done: int
    skipped: int
    failed: int
    total: int


class BatchItemOut(Out):
    run: uuid.UUID
    status_before: RunStatus = Field(description="the run's status when it was selected")
    outcome: BatchItem.Outcome
    reason: str = Field(description="why it was skipped or failed")
    finished_at: datetime | None


class BatchOut(Out):
    code: uuid.UUID
    action: Batch.Action
    status: Batch.Status
    created_by: str
    created_at: datetime
    finished_at: datetime | None
    reason: str
    selection: dict[str, Any] = Field(description='{"runs": [...]} or {"filter": {...}}, as '
                                                  "asked")
    cancel_requested_at: datetime | None
    cancelled_by: str | None
    counts: BatchCountsOut
    items: list[BatchItemOut]


class BatchPreviewOut(Out):
    action: Batch.Action
    count: int = Field(description="the runs selected")
    eligible: int = Field(description="those the action fits now (the others would be "
                                      "skipped, unless they change meanwhile)")
    statuses: dict[str, int] = Field(description="how many runs of each status")
    runs: list[uuid.UUID] = Field(description="the runs, in order: POST them as runs to act "
                                              "on exactly these")


class IncidentFilter(Schema):
    """GET /api/incidents's query."""

    window: Literal["24h", "7d", "30d"] = Field(
        "24h", description="the span the bars cover: 24 bars of an hour, 28 of 6 hours, or "
                           "30 of a day")
    status: Literal["failed", "needs_attention"] | None = Field(
        None, description="one of the two; both if absent")
    agent: AgentName | None = None
    sort: Literal["count", "recent"] = Field(
        "count", description="the largest groups first, or those with the latest run first")
    limit: int = Field(100, ge=1, le=100)


class IncidentOut(Out):
    agent: str
    step: str = Field(description="the step (node) its runs failed at; \"\" if none on record")
    error_type: str = Field(description="their error's type; \"\" if none on record")
    status: RunStatus
    count: int = Field(description="its runs, however long ago they got there")
    first_seen: datetime = Field(description="when the first of them got there")
    last_seen: datetime = Field(description="when the latest of them got there")
    sample_message: str = Field(description="the latest one's error message")
    sample_run: uuid.UUID | None = Field(description="the latest one (null if it moved on "
                                                     "while it was read)")
    bars: list[int] = Field(description="runs that got there in each part of the window, "
                                        "oldest first (the sparkline)")
    filter: dict[str, str] = Field(description="GET /api/runs's filters for exactly its runs; "
                                               "a batch's filter too")


class IncidentListOut(Out):
    window: str
    start: datetime = Field(description="the window's start: bars[0] begins here")
    end: datetime
    bar_seconds: int = Field(description="each bar's span")
    more: bool = Field(description="more groups than limit")
    items: list[IncidentOut]


class WebhookAttemptOut(Out):
    number: int
    url: str
    started_at: datetime
    duration_ms: int
    status_code: int | None = Field(description="the receiver's answer; null: none came")
    response: str = Field(description="the start of the answer's body")
    error: str = Field(description="why no answer came (timeout, refused address...)")
    ok: bool


class WebhookDeliveryOut(Out):
    id: str = Field(description="the event's id, as the receiver got it (to detect replays)")
    type: str
    status: Literal["pending", "delivered", "failed"]
    created: datetime
    attempts: int
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    tries: list[WebhookAttemptOut]


class RunWebhooksOut(Out):
    url: str | None = Field(description="where the run's events go; null: nowhere")
    deliveries: list[WebhookDeliveryOut]


class WebhookSecretOut(Out):
    key: str = Field(description="the API key's prefix")
    secret: str = Field(description="shown this once: store it where your receiver reads it")


class WebhookDefaultIn(In):
    url: str = Field(max_length=2000, description="empty: no default")


class WebhookDefaultOut(Out):
    key: str
    url: str


# -- workers and the queue (api/workers.py) ---------------------------------------------------

class HeldRunOut(Out):
    code: uuid.UUID
    agent: str
    status: RunStatus
    lease_owner: str = Field(description="the process holding the run's lease: host:pid:tag")


class WorkerOut(Out):
    name: str = Field(description="Celery's name of the worker (name@host)")
    host: str
    pid: int | None = Field(description="its main process")
    pids: list[int] = Field(description="the processes that run its tasks (leases name them)")
    concurrency: int | None
    pool: str
    version: str = Field(description="the code it runs")
    started_at: datetime | None = Field(description="when it started, by its own clock")
    alive: bool = Field(description="heard from in the last 60 s")
    last_heartbeat_seconds_ago: float
    runs: list[HeldRunOut] = Field(description="the runs its processes hold now")


class WorkersOut(Out):
    broker_ok: bool = Field(description="the broker answered: when it did not, nothing is "
                                        "known of the workers and `workers` is empty")
    version: str = Field(description="the code this web server runs")
    alive: int = Field(description="workers heard from in the last 60 s")
    workers: list[WorkerOut] = Field(description="the workers heard from in the last day, the "
                                                 "latest heartbeat first")
    unclaimed: list[HeldRunOut] = Field(description="live runs whose lease names no process "
                                                    "of a live worker (its worker died: the "
                                                    "sweeper hands them to recovery)")


class OldestPendingOut(Out):
    code: uuid.UUID
    agent: str
    created_at: datetime
    waited_seconds: float


class QueueOut(Out):
    depth: int | None = Field(description="messages waiting in the broker's queue; null when "
                                          "the broker did not answer")
    pending: int = Field(description="runs pending (waiting for a worker)")
    oldest_pending: OldestPendingOut | None
    backlog_warn_seconds: float = Field(description="STATEGUARD_BACKLOG_WARN_SECONDS")
    backlogged: bool = Field(description="the oldest pending run has waited longer than that")


class MinuteOut(Out):
    minute: datetime = Field(description="the minute's start (UTC)")
    submitted: int
    started: int = Field(description="runs a worker first took from the queue")
    succeeded: int
    compensated: int
    needs_attention: int


class ThroughputOut(Out):
    minutes: list[MinuteOut] = Field(description="oldest first; the last is the current minute")


class ThroughputFilter(Schema):
    minutes: int = Field(60, ge=1, le=1440, description="how many minutes back, this one "
                                                        "included")
