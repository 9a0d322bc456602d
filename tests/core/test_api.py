"""The public surface: ``__all__`` and a core that never imports a web framework."""

from __future__ import annotations

import subprocess
import sys

import stateguard

EXPECTED = {
    "ApprovalRejected", "ApprovalStatus", "Compensation", "CompensationFailed",
    "CompensationOutcome", "CompensationRetry", "CompensationStatus", "ConfigurationError",
    "Effect", "EffectLedger", "EffectRecord", "EffectStatus", "effect_key", "record_effect",
    "step_effects",
    "ErrorInfo", "Event", "ExceptionContext", "GuardedState", "InMemoryJournal",
    "InvalidRunState", "Invariant", "InvariantInfo", "InvariantViolation", "Journal",
    "LeaseLost",
    "Retriable", "RetryLater", "RunLocked", "RunNotFound", "RunStatus", "RunTerminated",
    "RunView", "SagaAborted", "SqliteJournal", "StateGuardCheckpointer", "StateGuardError",
    "StepKind", "StepStatus", "StopRequest", "SweepReport",
    "ToolCall", "ToolCallFailed", "UnwindReport", "tool_calls",
}


def test_it_exports_exactly_the_documented_names_sorted() -> None:
    assert set(stateguard.__all__) == EXPECTED
    assert stateguard.__all__ == sorted(stateguard.__all__)
    for name in stateguard.__all__:
        assert getattr(stateguard, name) is not None


def test_it_documents_each_exception_on_its_own() -> None:
    # help(ApprovalRejected) showed StateGuardError's docstring
    errors = [getattr(stateguard, name) for name in stateguard.__all__
              if isinstance(getattr(stateguard, name), type)
              and issubclass(getattr(stateguard, name), BaseException)]
    assert len(errors) >= 10
    assert [e.__name__ for e in errors if not e.__dict__.get("__doc__")] == []


def test_it_imports_no_web_framework() -> None:
    code = ("import sys, stateguard; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'django', 'celery', 'channels', 'daphne', 'ninja', 'kombu'}); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_it_keeps_violations_out_of_langgraph_retries() -> None:
    # LangGraph's default RetryPolicy retries most exceptions; re-running a node because an
    # invariant failed after it would repeat its external effect.
    import pytest
    from langgraph.graph import START, StateGraph
    from langgraph.types import RetryPolicy

    from tests.core.support import LineState, config

    runs: list[int] = []
    builder = StateGraph(LineState)
    builder.add_node("charge", lambda s: runs.append(1) or {"balance": -1},
                     retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.001))
    builder.add_edge(START, "charge")
    guard = stateguard.StateGuardCheckpointer(invariants=[lambda s: s.get("balance", 0) >= 0])
    with pytest.raises(stateguard.SagaAborted):
        guard.invoke(guard.compile(builder), {}, config("retry"))
    assert runs == [1]
