"""The drop-in form: builder.compile(checkpointer=guard) and a plain graph.invoke."""

from __future__ import annotations

import warnings

import pytest

from stateguard import (
    ConfigurationError,
    InvariantViolation,
    RunStatus,
    StateGuardCheckpointer,
    StateGuardWarning,
)
from tests.core.support import FAST_RETRY, config, line_builder, undo

NODES = ["reserve", "charge", "email", "ship"]


def no_negative_balance(state: dict[str, int]) -> bool:
    return state.get("balance", 0) >= 0


def make(effects: list[str]) -> StateGuardCheckpointer:
    return StateGuardCheckpointer(
        invariants=[no_negative_balance],
        compensations={n: undo(effects, n) for n in ("reserve", "charge", "email")},
        compensation_retry=FAST_RETRY)


def test_it_compensates_before_the_node_error_reaches_the_caller() -> None:
    effects: list[str] = []
    guard = make(effects)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)

    with pytest.warns(StateGuardWarning, match="durability='async'"), \
            pytest.raises(ValueError, match="ship failed") as caught:
        graph.invoke({"fail_at": "ship"}, config("d1"))

    assert effects == ["reserve", "charge", "email", "undo:email", "undo:charge", "undo:reserve"]
    report = caught.value.stateguard_report  # type: ignore[attr-defined]
    assert report.compensated == ["email", "charge", "reserve"]
    assert any("StateGuard" in note for note in caught.value.__notes__)
    assert guard.status("d1").run.status == RunStatus.COMPENSATED


def test_it_warns_once_per_guard() -> None:
    effects: list[str] = []
    graph = line_builder(NODES, effects).compile(checkpointer=make(effects))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        graph.invoke({}, config("w1"))
        graph.invoke({}, config("w2"))
    assert sum(issubclass(w.category, StateGuardWarning) for w in seen) == 1


def test_it_stops_before_the_next_node_under_sync_durability() -> None:
    effects: list[str] = []
    guard = make(effects)
    builder = line_builder(NODES, effects, {"charge": lambda s: {"balance": -5}})
    graph = builder.compile(checkpointer=guard)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning in the mode where everything holds
        with pytest.raises(InvariantViolation) as caught:
            graph.invoke({"balance": 10}, config("d2"), durability="sync")

    assert effects == ["reserve", "charge", "undo:charge", "undo:reserve"]
    assert caught.value.node == "charge"
    assert caught.value.stateguard_report.compensated == ["charge", "reserve"]  # type: ignore[attr-defined]


def test_it_compensates_nodes_that_ran_after_a_violation_under_async() -> None:
    effects: list[str] = []
    guard = make(effects)
    builder = line_builder(NODES, effects, {"charge": lambda s: {"balance": -5}})
    graph = builder.compile(checkpointer=guard)

    with pytest.warns(StateGuardWarning), pytest.raises(InvariantViolation):
        graph.invoke({"balance": 10}, config("d3"))

    # LangGraph did not wait for the checkpoint, so later nodes may have run; whatever ran with
    # an effect and a compensation was undone exactly once.
    for node in ("reserve", "charge", "email"):
        assert effects.count(f"undo:{node}") == effects.count(node)
    assert effects.index("undo:charge") > effects.index("charge")


def test_it_unwinds_a_guarded_graph_invoked_without_the_runner() -> None:
    effects: list[str] = []
    guard = make(effects)
    graph = guard.compile(line_builder(NODES, effects, {"charge": lambda s: {"balance": -5}}))

    with pytest.raises(InvariantViolation) as caught:
        graph.invoke({"balance": 10}, config("d4"))

    assert effects == ["reserve", "charge", "undo:charge", "undo:reserve"]
    assert caught.value.stateguard_report.compensated == ["charge", "reserve"]  # type: ignore[attr-defined]


def test_it_rejects_a_compensation_for_a_node_the_graph_lacks_at_first_invoke() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"chrage": undo(effects, "charge")})
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ConfigurationError, match="chrage"):
        graph.invoke({}, config("d5"))
    assert effects == []  # nothing ran


def test_it_refuses_approval_gates_without_instrumentation() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["charge"])
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ConfigurationError, match=r"guard\.compile"):
        graph.invoke({}, config("d6"))
    assert effects == []
