"""Threads and turns: LangGraph's chat pattern invokes one thread once per user turn, and each
turn is a saga of its own (issue 12, items 6-8), in both forms, on an in-memory and a SQLite
saver and journal."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from stateguard import (
    GuardedState,
    InvariantViolation,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from stateguard.unwind import plan
from tests.core.support import FAST_RETRY, LineState, config, line_builder, undo

NODES = ["charge", "ship"]


def guard_for(stores: dict[str, Any], effects: list[str], **kwargs: Any
              ) -> StateGuardCheckpointer:
    return StateGuardCheckpointer(stores["saver"], journal=stores["journal"],
                                  compensations={"charge": undo(effects, "charge")},
                                  compensation_retry=FAST_RETRY, **kwargs)


def test_it_undoes_only_the_failing_turn_in_the_drop_in_form(stores: dict[str, Any]) -> None:
    effects: list[str] = []
    guard = guard_for(stores, effects)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)

    graph.invoke({"fail_at": ""}, config("chat"))
    assert guard.status("chat").run.status == RunStatus.SUCCEEDED  # the turn is settled
    with pytest.raises(ValueError, match="ship failed") as caught:
        graph.invoke({"fail_at": "ship"}, config("chat"))

    # Turn 1's charge is kept: only turn 2's is refunded.
    assert effects == ["charge", "ship", "charge", "undo:charge"]
    report = caught.value.stateguard_report  # type: ignore[attr-defined]
    assert [(o.node, str(o.status)) for o in report.outcomes] == [("charge", "succeeded")]
    view = guard.status("chat")
    assert (view.run.status, view.run.turn) == (RunStatus.COMPENSATED, 2)
    assert sorted((s.turn, s.node) for s in view.steps) == [
        (1, "charge"), (1, "ship"), (2, "charge"), (2, "ship")]

    # A third turn after the compensated one is a saga of its own again.
    effects.clear()
    assert graph.invoke({"fail_at": ""}, config("chat"))["log"][-2:] == NODES
    assert effects == ["charge", "ship"]
    assert guard.status("chat").run.status == RunStatus.SUCCEEDED


def test_it_runs_a_later_turn_and_undoes_only_it_in_the_guarded_form(
        stores: dict[str, Any]) -> None:
    effects: list[str] = []
    guard = guard_for(stores, effects)
    graph = guard.compile(line_builder(NODES, effects))

    guard.invoke(graph, {"fail_at": ""}, config("chat"))
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(graph, {"fail_at": "ship"}, config("chat"))

    assert effects == ["charge", "ship", "charge", "undo:charge"]
    assert caught.value.report.compensated == ["charge"]
    assert guard.status("chat").run.status == RunStatus.COMPENSATED

    out = guard.invoke(graph, {"fail_at": ""}, config("chat"))  # a third turn
    assert out["log"] == ["charge", "ship", "charge", "charge", "ship"]
    assert guard.status("chat").run.status == RunStatus.SUCCEEDED
    assert guard.status("chat").run.turn == 3


def no_negative_balance(state: dict[str, Any]) -> bool:
    return state.get("balance", 0) >= 0


def test_it_takes_update_state_as_the_saver_does_and_checks_it_when_the_run_goes_on(
        stores: dict[str, Any]) -> None:
    # update_state is LangGraph's, not a step of the saga: saved as the plain saver saves it,
    # nothing unwound for it. The invariants judge the state when the thread runs again.
    effects: list[str] = []
    guard = guard_for(stores, effects, invariants=[no_negative_balance])
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    graph.invoke({"balance": 10}, config("done"))

    graph.update_state(config("done"), {"balance": -5})

    assert graph.get_state(config("done")).values["balance"] == -5
    assert effects == ["charge", "ship"]  # the finished run's charge is kept
    assert guard.status("done").run.status == RunStatus.SUCCEEDED
    with pytest.raises(InvariantViolation, match="no_negative_balance") as caught:
        graph.invoke(None, config("done"))  # nothing left to run: the final state is checked
    assert caught.value.stateguard_report.outcomes == ()  # type: ignore[attr-defined]
    assert effects == ["charge", "ship"]  # that turn had no step to undo
    graph.update_state(config("done"), {"balance": 3})
    assert graph.get_state(config("done")).values["balance"] == 3


def test_it_resumes_after_a_compensated_failure_once_the_state_is_fixed(
        stores: dict[str, Any]) -> None:
    # Plain LangGraph: fix the state with update_state, then invoke(None) runs the failed node
    # again. Through the drop-in that is a new turn, unwound on its own if it fails.
    effects: list[str] = []
    guard = guard_for(stores, effects)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("fix"), durability="sync")
    assert effects == ["charge", "undo:charge"]

    graph.update_state(config("fix"), {"fail_at": ""})
    out = graph.invoke(None, config("fix"), durability="sync")

    assert out["log"] == ["charge", "ship"]
    assert effects == ["charge", "undo:charge", "ship"]
    assert guard.status("fix").run.status == RunStatus.SUCCEEDED


def ask_builder(effects: list[str]) -> StateGraph[Any, Any, Any, Any]:
    """``charge``, then ``confirm``, which asks the user with interrupt(), then ``ship``."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def charge(state: dict[str, Any]) -> dict[str, Any]:
        effects.append("charge")
        return {"log": ["charge"]}

    def confirm(state: dict[str, Any]) -> dict[str, Any]:
        answer = interrupt({"question": "ship it?"})
        if answer != "yes":
            raise ValueError(f"user said {answer!r}")
        return {"log": ["confirm"]}

    builder.add_node("charge", charge)
    builder.add_node("confirm", confirm)
    builder.add_node("ship", lambda s: effects.append("ship") or {"log": ["ship"]})
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "confirm")
    builder.add_edge("confirm", "ship")
    builder.add_edge("ship", END)
    return builder


@pytest.mark.parametrize("answer", ["yes", "no"])
def test_it_resumes_a_users_own_interrupt_through_the_runner(
        stores: dict[str, Any], answer: str) -> None:
    effects: list[str] = []
    guard = guard_for(stores, effects)
    graph = guard.compile(ask_builder(effects))
    out = guard.invoke(graph, {}, config("ask"))
    assert "__interrupt__" in out
    assert guard.status("ask").run.status == RunStatus.PAUSED

    if answer == "yes":
        out = guard.invoke(graph, Command(resume="yes"), config("ask"))
        assert out["log"] == ["charge", "confirm", "ship"]
        assert effects == ["charge", "ship"]
        assert guard.status("ask").run.status == RunStatus.SUCCEEDED
    else:
        with pytest.raises(SagaAborted, match="user said 'no'"):
            guard.invoke(graph, Command(resume="no"), config("ask"))
        assert effects == ["charge", "undo:charge"]  # the same turn: its charge is undone
        assert guard.status("ask").run.status == RunStatus.COMPENSATED


def test_it_marks_a_drop_in_turn_paused_by_interrupt_and_resumes_it_in_the_same_turn(
        stores: dict[str, Any]) -> None:
    effects: list[str] = []
    guard = guard_for(stores, effects)
    graph = ask_builder(effects).compile(checkpointer=guard)
    graph.invoke({}, config("ask"))
    assert guard.status("ask").run.status == RunStatus.PAUSED

    with pytest.raises(ValueError, match="user said"):
        graph.invoke(Command(resume="no"), config("ask"))
    assert effects == ["charge", "undo:charge"]  # charge was of this turn


@pytest.mark.parametrize("form", ["dropin", "guarded"])
def test_it_journals_a_node_that_calls_interrupt_as_paused_then_as_it_ends_on_resume(
        stores: dict[str, Any], form: str) -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(stores["saver"], journal=stores["journal"],
                                   compensations={"charge": undo(effects, "charge"),
                                                  "confirm": undo(effects, "confirm")},
                                   compensation_retry=FAST_RETRY)
    if form == "dropin":
        graph = ask_builder(effects).compile(checkpointer=guard)

        def invoke(value: Any, thread: str) -> Any:
            return graph.invoke(value, config(thread), durability="sync")
    else:
        graph = guard.compile(ask_builder(effects))

        def invoke(value: Any, thread: str) -> Any:
            return guard.invoke(graph, value, config(thread))

    def step(thread: str, node: str) -> Any:
        return next(s for s in guard.status(thread).steps if s.node == node)

    for thread in ("yes", "undo"):
        invoke({}, thread)
        assert guard.status(thread).run.status == RunStatus.PAUSED
        paused = step(thread, "confirm")
        # waiting, not failed: no error to show, nothing to undo
        assert (paused.status, paused.error, paused.attempt) == (StepStatus.PAUSED, None, 1)
        assert step(thread, "charge").status == StepStatus.SUCCEEDED

    # Resumed, the node runs again from its start: the same step, started anew, succeeds.
    out = invoke(Command(resume="yes"), "yes")
    assert out["log"] == ["charge", "confirm", "ship"]
    resumed = step("yes", "confirm")
    assert (resumed.status, resumed.error, resumed.attempt) == (StepStatus.SUCCEEDED, None, 2)
    assert guard.status("yes").run.status == RunStatus.SUCCEEDED

    # Unwound while paused: the charge is undone, the paused step is not (it had no effect).
    planned = plan(guard.core.journal, "undo", guard.core.spec, include_in_doubt=True)
    assert [p.step.node for p in planned if p.compensation is not None] == ["charge"]
    if form == "guarded":  # the operator's "compensate" (the drop-in form has none)
        report = guard.compensate(graph, config("undo"))
        assert [(o.node, str(o.status)) for o in report.outcomes] == [("charge", "succeeded")]
        assert guard.status("undo").run.status == RunStatus.COMPENSATED
        assert step("undo", "confirm").status == StepStatus.PAUSED
    assert effects == ["charge", "charge", "ship"] + (
        ["undo:charge"] if form == "guarded" else [])


def test_it_undoes_only_the_failing_block_of_a_guarded_state_entered_again(
        stores: dict[str, Any]) -> None:
    effects: list[str] = []
    comps = {"charge": undo(effects, "charge")}
    with GuardedState({}, run_id="order", compensations=comps,
                      journal=stores["journal"]) as saga:
        saga.step("charge", lambda s: effects.append("charge") or {"paid": True})
    with pytest.raises(SagaAborted), GuardedState(
            {}, run_id="order", compensations=comps, journal=stores["journal"]) as saga:
        saga.step("charge", lambda s: effects.append("charge") or {"paid": True})
        raise ValueError("warehouse down")

    assert effects == ["charge", "charge", "undo:charge"]

