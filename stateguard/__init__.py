"""StateGuard: sagas for AI agents that act on the real world.

``from stateguard import StateGuardCheckpointer`` and compile a LangGraph graph with it: every
step is journaled, invariants are checked after each step, and when a step fails, an invariant
breaks or an operator says so, the compensations of the steps that happened run newest first,
retried and idempotent. ``GuardedState`` does the same for plain Python code.

The names below are imported when first used (PEP 562), not with the package: ``import
stateguard.testing`` (the pytest plugin, loaded in every pytest session once stateguard is
installed) must not pay for LangGraph.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stateguard.checkpointer import StateGuardCheckpointer
    from stateguard.context import ExceptionContext, InvariantInfo
    from stateguard.effects import (
        Effect,
        EffectLedger,
        EffectRecord,
        EffectStatus,
        effect_key,
        record_effect,
        step_effects,
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
        RunTerminated,
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
    from stateguard.stops import StopRequest
    from stateguard.sweep import SweepReport
    from stateguard.tool_calls import ToolCall, tool_calls

# Each public name and the module that defines it.
_WHERE = {
    "ApprovalRejected": "stateguard.exceptions",
    "ApprovalStatus": "stateguard.records",
    "Compensation": "stateguard.spec",
    "CompensationFailed": "stateguard.exceptions",
    "CompensationOutcome": "stateguard.report",
    "CompensationRetry": "stateguard.retry",
    "CompensationStatus": "stateguard.records",
    "ConfigurationError": "stateguard.exceptions",
    "Effect": "stateguard.effects",
    "EffectLedger": "stateguard.effects",
    "EffectRecord": "stateguard.effects",
    "EffectStatus": "stateguard.effects",
    "ErrorInfo": "stateguard.records",
    "Event": "stateguard.events",
    "ExceptionContext": "stateguard.context",
    "GuardedState": "stateguard.guarded_state",
    "InMemoryJournal": "stateguard.journal",
    "InvalidRunState": "stateguard.exceptions",
    "Invariant": "stateguard.spec",
    "InvariantInfo": "stateguard.context",
    "InvariantViolation": "stateguard.exceptions",
    "LeaseLost": "stateguard.exceptions",
    "Journal": "stateguard.journal",
    "Retriable": "stateguard.kinds",
    "RetryLater": "stateguard.retry",
    "RunLocked": "stateguard.exceptions",
    "RunNotFound": "stateguard.exceptions",
    "RunTerminated": "stateguard.exceptions",
    "RunStatus": "stateguard.records",
    "RunView": "stateguard.records",
    "SagaAborted": "stateguard.exceptions",
    "SqliteJournal": "stateguard.sqlite_journal",
    "SweepReport": "stateguard.sweep",
    "StateGuardCheckpointer": "stateguard.checkpointer",
    "StateGuardError": "stateguard.exceptions",
    "StepKind": "stateguard.kinds",
    "StepStatus": "stateguard.records",
    "StopRequest": "stateguard.stops",
    "ToolCall": "stateguard.tool_calls",
    "ToolCallFailed": "stateguard.exceptions",
    "UnwindReport": "stateguard.report",
    "effect_key": "stateguard.effects",
    "record_effect": "stateguard.effects",
    "step_effects": "stateguard.effects",
    "tool_calls": "stateguard.tool_calls",
}
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
    "RunTerminated",
    "RunView",
    "SagaAborted",
    "SqliteJournal",
    "StateGuardCheckpointer",
    "StateGuardError",
    "StepKind",
    "StepStatus",
    "StopRequest",
    "SweepReport",
    "ToolCall",
    "ToolCallFailed",
    "UnwindReport",
    "effect_key",
    "record_effect",
    "step_effects",
    "tool_calls",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'stateguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """Keeps a public name from being bound over by a submodule of the same name: importing
    ``stateguard.tool_calls`` (the module) would otherwise make ``stateguard.tool_calls``, the
    function, that module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
