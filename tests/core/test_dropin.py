"""The drop-in form: builder.compile(checkpointer=guard) and a plain graph.invoke."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import warnings
from typing import Any

import langgraph.pregel._loop
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.pregel._loop import AsyncPregelLoop, SyncPregelLoop

from stateguard import (
    ConfigurationError,
    InvariantViolation,
    RunStatus,
    StateGuardCheckpointer,
    StateGuardWarning,
    dropin,
)
from tests.core.support import FAST_RETRY, LineState, config, line_builder, undo

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


def ship(state: dict[str, Any]) -> dict[str, Any]:
    if state.get("fail_at") == "ship":
        raise ValueError("ship failed")
    return {"log": ["ship"]}


def money_builder(pay: Any, then: Any = ship) -> StateGraph[Any, Any, Any, Any]:
    """``pay``, tagged "money" (a tag-keyed compensation refunds it), then ``then``."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    builder.add_node("pay", pay, metadata={"tags": ["money"]})
    builder.add_node(then.__name__, then)
    builder.add_edge(START, "pay")
    builder.add_edge("pay", then.__name__)
    builder.add_edge(then.__name__, END)
    return builder


def money_graph(guard: StateGuardCheckpointer, seen: list[Any] | None = None) -> Any:
    """A money graph whose ``pay`` puts the loop the observer follows for its run in ``seen``."""

    def pay(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        if seen is not None:
            live = guard._observer._runs[config["configurable"]["thread_id"]]
            seen.append(live.loop() if live.loop is not None else None)
        return {"log": ["pay"]}

    return money_builder(pay).compile(checkpointer=guard)


def test_it_follows_langgraphs_loop_and_forgets_a_run_when_the_loop_exits(
        caplog: pytest.LogCaptureFixture) -> None:
    # The observer relies on LangGraph internals; with the pinned LangGraph it must find them,
    # so an upgrade that moves them fails here rather than degrading silently.
    guard = StateGuardCheckpointer()
    loops: list[Any] = []  # kept alive: the run must be forgotten at the exit, not collection
    graph = money_graph(guard, loops)
    with caplog.at_level(logging.WARNING, logger="stateguard"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph.invoke({}, config("sync"))
        asyncio.run(graph.ainvoke({}, config("async")))
    assert [type(loop) for loop in loops] == [SyncPregelLoop, AsyncPregelLoop]
    assert guard._observer._runs == {}
    assert caplog.records == []


@pytest.mark.parametrize("moved", ["module", "class", "stack"])
def test_it_still_observes_when_langgraphs_internals_move(
        moved: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A later LangGraph 1.x may rename the private module, the loop class or its exit stack.
    if moved == "module":
        monkeypatch.setitem(sys.modules, "langgraph.pregel._loop", None)  # import fails
    elif moved == "class":
        monkeypatch.delattr(langgraph.pregel._loop, "PregelLoop")
    else:
        monkeypatch.setattr(dropin, "_LOOP_STACK", "exit_stack", raising=False)
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"money": undo(effects, "money")})
    graph = money_graph(guard)
    with caplog.at_level(logging.WARNING, logger="stateguard"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for thread in ("m1", "m2"):
            with pytest.raises(ValueError, match="ship failed"):
                graph.invoke({"fail_at": "ship"}, config(thread))
    assert effects == ["undo:money"] * 2  # pay's tag still comes from the graph
    assert len(caplog.records) == 1  # logged once per guard, not on every invoke
    assert "LangGraph internals moved" in caplog.records[0].getMessage()
    if moved == "stack":  # the loop was found: its collection ends the run
        gc.collect()
        assert guard._observer._runs == {}
