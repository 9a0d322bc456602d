"""Invariants over tool calls (``tool_calls(state)``), checked on the graph's state, also in the
Send tasks of create_react_agent v2."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from stateguard import InvariantViolation, RunStatus, SagaAborted, StateGuardCheckpointer
from stateguard.tool_calls import ToolCall, tool_calls
from tests.core.agent_support import SHAPES, Shape, Travel, ask, say
from tests.core.tool_forms import FORMS, Form, make_guard, run_agent

BUDGET = 100_00


def within_budget(state: dict[str, Any]) -> bool:
    """total charged is within the budget"""
    return sum(c.args["amount"] for c in tool_calls(state, "charge_card")) <= BUDGET


def no_booking_without_charge(state: dict[str, Any]) -> bool:
    """no booking without a charge"""
    return not tool_calls(state, "book_flight") or bool(
        tool_calls(state, "charge_card", status="success"))


def reads_the_conversation(state: dict[str, Any]) -> bool:
    # Reads state["messages"] directly: a Send task's payload has no such key.
    return isinstance(state["messages"], list)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_stops_a_charge_over_budget_before_it_runs(shape: Shape, form: Form) -> None:
    world = Travel()
    guard = make_guard(world, invariants=[within_budget, reads_the_conversation])
    script = [ask(("charge_card", {"amount": 60_00})), ask(("charge_card", {"amount": 60_00})),
              say("paid")]
    _, error = run_agent(form, shape, world, script, guard, "budget")

    violation = error.cause if isinstance(error, SagaAborted) else error
    assert isinstance(violation, InvariantViolation), error
    assert violation.invariant == "within_budget" and violation.node == "agent"
    assert [a for _, a in world.charges] == [60_00]  # the second was only proposed
    assert world.refunded == [world.charges[0][0]]
    assert guard.status("budget").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_checks_send_tasks_against_the_graphs_state(shape: Shape, form: Form) -> None:
    world = Travel()
    # no compensation keyed by a tool: only the state the Send tasks are judged on matters
    guard = StateGuardCheckpointer(invariants=[reads_the_conversation,
                                               no_booking_without_charge])
    script = [ask(("charge_card", {"amount": 50_00})),
              ask(("book_flight", {"destination": "Oslo"})), say("booked")]
    _, error = run_agent(form, shape, world, script, guard, "send-state")

    assert error is None, error
    assert world.bookings == ["Oslo"] and world.refunds == []
    assert guard.status("send-state").run.status == RunStatus.SUCCEEDED


def test_it_refuses_a_booking_the_model_asks_for_before_any_charge() -> None:
    world = Travel()
    guard = make_guard(world, invariants=[no_booking_without_charge])
    _, error = run_agent("guarded", "v2", world,
                         [ask(("book_flight", {"destination": "Oslo"})), say("booked")],
                         guard, "unpaid")
    assert isinstance(error, SagaAborted) and world.bookings == []
    assert "no booking without a charge" in str(error)


def test_it_reads_calls_with_their_answers() -> None:
    state = {"messages": [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"name": "charge_card", "args": {"amount": 5}, "id": "a"},
                                  {"name": "book_flight", "args": {"destination": "x"},
                                   "id": "b"},
                                  {"name": "charge_card", "args": {"amount": 7}, "id": "c"}]),
        ToolMessage('{"charge_id": "ch_1"}', tool_call_id="a", name="charge_card"),
        ToolMessage("no seats", tool_call_id="b", name="book_flight", status="error"),
    ]}
    calls = tool_calls(state)
    assert [(c.name, c.status) for c in calls] == [
        ("charge_card", "success"), ("book_flight", "error"), ("charge_card", "requested")]
    assert calls[0].result == {"charge_id": "ch_1"} and calls[1].result == "no seats"
    assert [c.id for c in tool_calls(state, "charge_card", status="success")] == ["a"]
    assert tool_calls({}) == []
    # dict messages (a state restored from JSON) read the same
    as_dicts = {"messages": [{"type": "ai", "tool_calls": [{"name": "t", "args": {}, "id": "z"}]},
                             {"type": "tool", "tool_call_id": "z", "content": "ok"}]}
    assert tool_calls(as_dicts) == [ToolCall("z", "t", {}, "success", "ok")]


def test_it_prefers_the_artifact_as_the_result() -> None:
    call = ToolCall("a", "charge_card", {}, "success", "charged", {"charge_id": "ch_9"})
    assert call.result == {"charge_id": "ch_9"}
    assert ToolCall.from_update(call.as_update()) == call
    assert ToolCall.from_update({"messages": []}) is None
