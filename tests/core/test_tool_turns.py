"""A chat agent's conversation across turns: a guarded agent invoked the plain way, and the
turn after one whose tool calls failed and were undone."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from stateguard import RunStatus, SagaAborted, StateGuardCheckpointer
from tests.core.agent_support import SHAPES, BookingFailed, Shape, Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config

WAYS = ("dropin", "compiled", "runner")  # compiled: guard.compile, then a plain invoke


def conversation() -> list[Any]:
    """Turn 1 charges and books; turn 2 charges, and its booking fails; turn 3 chats."""
    return [ask(("charge_card", {"amount": 40_00})), ask(("book_flight", {"destination": "Oslo"})),
            say("booked"),
            ask(("charge_card", {"amount": 60_00}), ("book_flight", {"destination": "nowhere"})),
            say("hello again")]


def turn(way: str, guard: StateGuardCheckpointer, graph: Any, text: str) -> Any:
    if way == "runner":
        try:
            return guard.invoke(graph, go(text), config("chat"))
        except SagaAborted as aborted:
            assert aborted.cause is not None
            raise aborted.cause from None
    return graph.invoke(go(text), config("chat"))


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_goes_on_with_the_conversation_after_an_unwound_turn(shape: Shape, way: str) -> None:
    world = Travel()
    guard = StateGuardCheckpointer(compensations={"charge_card": world.refund},
                                   compensation_retry=FAST_RETRY)
    graph = (agent(shape, world, conversation(), checkpointer=guard) if way == "dropin"
             else guard.compile(agent(shape, world, conversation())))

    assert turn(way, guard, graph, "book Oslo")["messages"][-1].content == "booked"
    with pytest.raises(BookingFailed) as caught:
        turn(way, guard, graph, "and nowhere")
    out = turn(way, guard, graph, "hi")  # LangGraph's agent refused this history before

    assert out["messages"][-1].content == "hello again"
    assert [amount for _, amount in world.charges] == [40_00, 60_00]
    assert world.refunded == ["ch_2"]  # the failed turn's charge; the first turn's is kept
    if way != "runner":
        assert caught.value.stateguard_report.compensated == ["charge_card"]  # type: ignore[attr-defined]
    messages = out["messages"]
    asked = next(i for i, m in enumerate(messages) if isinstance(m, AIMessage)
                 and len(m.tool_calls) == 2)
    answers = {m.tool_call_id: m for m in messages[asked:] if isinstance(m, ToolMessage)}
    # Every call of the failed turn answered once; the failed one says what was undone (in v2
    # the charge ran in a task of its own, which kept its answer).
    assert sorted(answers) == sorted(c["id"] for c in messages[asked].tool_calls)
    failed = answers["book_flight-2"]
    assert failed.status == "error"
    assert "no flight to nowhere" in failed.content and "undone: charge_card" in failed.content
    assert answers["charge_card-1"].status == ("success" if shape == "v2" else "error")
    view = guard.status("chat")
    assert (view.run.status, view.run.turn) == (RunStatus.SUCCEEDED, 3)
    assert graph.get_state(config("chat")).next == ()


@pytest.mark.parametrize("shape", SHAPES)
def test_it_answers_the_calls_a_rejected_approval_left_waiting(shape: Shape) -> None:
    world = Travel()
    guard = StateGuardCheckpointer(compensations={"charge_card": world.refund},
                                   approvals={"charge_card": lambda args: args["amount"] > 50_00},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(agent(shape, world, [
        ask(("charge_card", {"amount": 90_00})), say("hello again")]))
    graph.invoke(go("charge me"), config("chat"))

    guard.reject(graph, config("chat"), by="bob", reason="too much")
    out = graph.invoke(go("hi"), config("chat"))

    assert out["messages"][-1].content == "hello again"
    assert world.charges == []
    answer = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert "rejected by bob: too much" in answer.content
