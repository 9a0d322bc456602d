"""What the journal stores: runs, steps, compensations (with every attempt) and approvals.

Plain dataclasses with string statuses so that any journal (in memory, SQLite, the Django app)
can store them without knowing StateGuard's classes.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for journals: pydantic models and dataclasses as dicts, sets
    as lists, anything else as its ``repr`` (a journal must never fail to record a step)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


class RunStatus(StrEnum):
    PENDING = "pending"  # submitted, not started yet (the web app queues runs)
    RUNNING = "running"
    PAUSED = "paused"  # waiting for an operator's approval
    FAILED = "failed"  # stopped by an error, held for an operator (retry or compensate)
    SUCCEEDED = "succeeded"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    NEEDS_ATTENTION = "needs_attention"  # an effect could not be undone automatically


class StepStatus(StrEnum):
    STARTED = "started"  # body running; if the process died, this step is in doubt
    # The body paused itself by interrupt(): no effect happened; LangGraph runs it again, from
    # its start, on resume (a new start of the same step). Undone only as a FAILED step is.
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the body raised: no effect, unless an in_doubt_safe compensation finds one
    VIOLATED = "violated"  # the body ran (its effect happened) but an invariant failed after it
    # Undone by an operator's retry from an earlier step (``stateguard.rewind``): its effect
    # was compensated and the run went on from the checkpoint before that step, so the step
    # ran again under another id. No longer part of the run's saga: never undone again.
    REWOUND = "rewound"


# Steps whose external effect happened and must be undone on unwind.
EFFECT_STATUSES = frozenset({StepStatus.SUCCEEDED, StepStatus.VIOLATED})


class CompensationStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    NOTHING_TO_UNDO = "nothing_to_undo"  # the compensation returned a falsy value
    FAILED = "failed"  # every attempt failed (or one failed for good): needs an operator
    SKIPPED_IN_DOUBT = "skipped_in_doubt"  # in-doubt step whose compensation is not safe to run
    # Its attempts are spent for now and its retry policy waits before trying again
    # (``RetryLater``): the run stays compensating until ``retry_at``.
    WAITING = "waiting"


DONE_COMPENSATIONS = frozenset({CompensationStatus.SUCCEEDED, CompensationStatus.NOTHING_TO_UNDO})
# Compensations that leave the run needing a person, and those an operator may run again now.
STUCK_COMPENSATIONS = frozenset({CompensationStatus.FAILED, CompensationStatus.SKIPPED_IN_DOUBT})
RETRYABLE_COMPENSATIONS = STUCK_COMPENSATIONS | {CompensationStatus.WAITING}


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


def _traceback(exc: BaseException, known: BaseException | None) -> str:
    # Suppress the implicit context on the links whose context is ``known``, for the
    # formatting only: the exceptions are the caller's, left as they were.
    links: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in links and known is not None:
        links.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    cut = [e for e in links if e.__context__ is known and e.__cause__ is None
           and not e.__suppress_context__]
    for e in cut:
        e.__suppress_context__ = True
    try:
        text = "".join(traceback.format_exception(exc)).strip()
    finally:
        for e in cut:
            e.__suppress_context__ = False
    if cut and known is not None:
        text += (f"\n(raised while handling the run's error, {type(known).__name__}: {known}; "
                 "its traceback is the run's)")
    return text


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException, *, known: BaseException | None = None
                       ) -> ErrorInfo:
        """``exc`` with its traceback. ``known`` is an error whose traceback is kept elsewhere
        (the run's error, while a compensation that raised was handling it): where ``exc``'s
        chain reaches it as an implicit context, it is named in one line, not repeated."""
        return cls(type(exc).__name__, str(exc), _traceback(exc, known))

    def to_dict(self) -> dict[str, str]:
        """For journals that store errors as JSON."""
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_dict(cls, data: Any) -> ErrorInfo | None:
        return cls(**data) if data else None

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


@dataclass(slots=True)
class RunRecord:
    run_id: str
    status: RunStatus = RunStatus.RUNNING
    error: ErrorInfo | None = None
    lock_owner: str | None = None
    lock_expires: float = 0.0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    # A thread's turns (one invoke each) are sagas of their own: a turn that finished is
    # settled, and an unwind undoes the steps of the current turn only.
    turn: int = 1


@dataclass(slots=True)
class StepRecord:
    run_id: str
    step_id: str  # LangGraph task id (stable across resumes) or "<n>:<name>" for GuardedState
    node: str
    tags: tuple[str, ...] = ()
    status: StepStatus = StepStatus.STARTED
    attempt: int = 1
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    done_seq: int | None = None  # order of completion within the run; unwind goes newest first
    update: Any = None  # what the node wrote
    # The state with the node's writes applied; its lists of messages journaled against an
    # earlier step's (stateguard.history: States rebuilds them whole).
    state_after: Any = None
    error: ErrorInfo | None = None
    turn: int = 1  # the run's turn when the step started
    # Its saga kind when it started (stateguard.kinds.StepKind): "compensatable", "pivot" or
    # "retriable". The unwind reads it from here, not from the guard's settings: a run is judged
    # by what its steps were when they ran.
    kind: str = "compensatable"


@dataclass(slots=True)
class AttemptRecord:
    number: int
    started_at: float
    finished_at: float
    ok: bool
    result: str = ""  # repr of the compensation's return value
    error: ErrorInfo | None = None


@dataclass(slots=True)
class CompensationRecord:
    run_id: str
    step_id: str
    node: str
    idempotency_key: str
    status: CompensationStatus = CompensationStatus.RUNNING
    triggered_by: str = "automatic"
    attempts: list[AttemptRecord] = field(default_factory=list)
    retry_at: float | None = None  # when a waiting compensation is tried again (epoch seconds)

    @property
    def last_error(self) -> ErrorInfo | None:
        for attempt in reversed(self.attempts):
            if attempt.error is not None:
                return attempt.error
        return None


@dataclass(slots=True)
class ApprovalRecord:
    run_id: str
    step_id: str
    node: str
    payload: Any = None
    status: ApprovalStatus = ApprovalStatus.PENDING
    decided_by: str | None = None
    reason: str = ""
    requested_at: float = field(default_factory=time.time)
    decided_at: float | None = None


@dataclass(frozen=True, slots=True)
class RunView:
    """Everything the journal knows about one run (``guard.status(...)``)."""

    run: RunRecord
    steps: list[StepRecord]
    compensations: list[CompensationRecord]
    approvals: list[ApprovalRecord]
    effects: list[Any] = field(default_factory=list)  # EffectRecords, if the journal keeps them

    @property
    def in_doubt(self) -> list[StepRecord]:
        """Steps that started and never finished: their effect may or may not have happened."""
        return [s for s in self.steps if s.status == StepStatus.STARTED]

    @property
    def pending_approvals(self) -> list[ApprovalRecord]:
        return [a for a in self.approvals if a.status == ApprovalStatus.PENDING]
