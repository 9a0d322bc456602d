"""StateGuard: sagas for AI agents that act on the real world.

``from stateguard import StateGuardCheckpointer`` and compile a LangGraph graph with it: every
step is journaled, invariants are checked after each step, and when a step fails, an invariant
breaks or an operator says so, the compensations of the steps that happened run newest first,
retried and idempotent. ``GuardedState`` does the same for plain Python code.
"""

from stateguard.checkpointer import StateGuardCheckpointer
from stateguard.context import ExceptionContext, InvariantInfo
from stateguard.effects import (
    Effect,
    EffectLedger,
    EffectRecord,
    EffectStatus,
    effect_key,
    record_effect,
)
from stateguard.events import Event
from stateguard.exceptions import (
    ApprovalRejected,
    CompensationFailed,
    ConfigurationError,
    InvalidRunState,
    InvariantViolation,
    LeaseLost,
    RunLocked,
    RunNotFound,
    SagaAborted,
    StateGuardError,
    ToolCallFailed,
)
from stateguard.guarded_state import GuardedState
from stateguard.journal import InMemoryJournal, Journal
from stateguard.kinds import Retriable, StepKind
from stateguard.records import (
    ApprovalStatus,
    CompensationStatus,
    ErrorInfo,
    RunStatus,
    RunView,
    StepStatus,
)
from stateguard.report import CompensationOutcome, UnwindReport
from stateguard.retry import CompensationRetry, RetryLater
from stateguard.spec import Compensation, Invariant
from stateguard.sqlite_journal import SqliteJournal
from stateguard.sweep import SweepReport
from stateguard.tool_calls import ToolCall, tool_calls

__all__ = [
    "ApprovalRejected",
    "ApprovalStatus",
    "Compensation",
    "CompensationFailed",
    "CompensationOutcome",
    "CompensationRetry",
    "CompensationStatus",
    "ConfigurationError",
    "Effect",
    "EffectLedger",
    "EffectRecord",
    "EffectStatus",
    "ErrorInfo",
    "Event",
    "ExceptionContext",
    "GuardedState",
    "InMemoryJournal",
    "InvalidRunState",
    "Invariant",
    "InvariantInfo",
    "InvariantViolation",
    "Journal",
    "LeaseLost",
    "Retriable",
    "RetryLater",
    "RunLocked",
    "RunNotFound",
    "RunStatus",
    "RunView",
    "SagaAborted",
    "SqliteJournal",
    "StateGuardCheckpointer",
    "StateGuardError",
    "StepKind",
    "StepStatus",
    "SweepReport",
    "ToolCall",
    "ToolCallFailed",
    "UnwindReport",
    "effect_key",
    "record_effect",
    "tool_calls",
]
