"""Tool calls in subgraphs, and tools that return a ``Command`` (issue 20, item 6).

A ``ToolNode`` inside a subgraph (an agent compiled as a node of a parent graph) is wrapped like
any other: each call is a step keyed by the tool's name. A tool that returns a ``Command`` is
replayed as that ``Command``: when LangGraph runs its task again, the state gets the update
again and the tool's body does not run twice."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from stateguard import RunStatus, SagaAborted, StateGuardCheckpointer, StepStatus
from stateguard.sqlite_journal import SqliteJournal
from stateguard.tool_calls import TOOL_TAG
from tests.core.agent_support import (
    SHAPES,
    BookingFailed,
    ScriptedModel,
    Shape,
    Travel,
    agent,
    ask,
    go,
    say,
)
from tests.core.support import FAST_RETRY, config
from tests.core.tool_forms import FORMS, Form, make_guard, saver_for


class ShipFailed(Exception):
    pass


def parent_of(shape: Shape, world: Travel, script: list[Any], *,
              fail_after: bool) -> StateGraph[Any, Any, Any, Any]:
    """The agent compiled as the ``assistant`` node of a parent graph; then ``ship``, which
    raises when told."""
    def ship(state: dict[str, Any]) -> dict[str, Any]:
        if fail_after:
            raise ShipFailed("the truck broke down")
        return {}

    parent: StateGraph[Any, Any, Any, Any] = StateGraph(MessagesState)
    parent.add_node("assistant", agent(shape, world, script))
    parent.add_node("ship", ship)
    parent.add_edge(START, "assistant")
    parent.add_edge("assistant", "ship")
    parent.add_edge("ship", END)
    return parent


def run(form: Form, guard: StateGuardCheckpointer, builder: StateGraph[Any, Any, Any, Any],
        thread: str) -> BaseException | None:
    try:
        if form == "dropin":
            builder.compile(checkpointer=guard).invoke(go(), config(thread), durability="sync")
        else:
            guard.invoke(guard.compile(builder), go(), config(thread))
    except Exception as exc:
        return exc
    return None


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("where", ["inside", "after"])
def test_a_tool_call_inside_a_subgraph_is_a_step_refunded_once(
        shape: Shape, form: Form, where: str) -> None:
    world = Travel()
    guard = make_guard(world)
    script = [ask(("charge_card", {"amount": 4200})),
              ask(("book_flight", {"destination": "nowhere" if where == "inside" else "Lisbon"})),
              say("booked")]
    error = run(form, guard, parent_of(shape, world, script, fail_after=where == "after"),
                "sub")

    expected = BookingFailed if where == "inside" else ShipFailed
    assert isinstance(error, SagaAborted if form == "guarded" else expected)
    [(charge_id, _)] = world.charges
    assert world.refunded == [charge_id]  # by the compensation keyed "charge_card", once
    view = guard.status("sub")
    assert view.run.status == RunStatus.COMPENSATED
    [charge] = [s for s in view.steps if s.node == "charge_card"]
    assert charge.status == StepStatus.SUCCEEDED and TOOL_TAG in charge.tags
    assert charge.update["args"] == {"amount": 4200}
    [(_, key)] = world.refunds
    [comp] = [c for c in view.compensations if c.step_id == charge.step_id]
    assert comp.idempotency_key == key and comp.status == "succeeded"
    if where == "inside":
        [booking] = [s for s in view.steps if s.node == "book_flight"]
        assert booking.status == StepStatus.FAILED


class BookingState(MessagesState):
    booking: str


class Desk:
    """A tool that answers with a ``Command`` (it writes ``booking``) and one that fails the
    first time it is called."""

    def __init__(self) -> None:
        self.booked: list[str] = []
        self.flaky_calls = itertools.count(1)

    def tools(self) -> list[Any]:
        desk = self

        @tool
        def book_flight(destination: str,
                        tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
            """Book a flight to ``destination``."""
            desk.booked.append(destination)
            ref = f"BK-{len(desk.booked)}"
            return Command(update={
                "booking": ref,
                "messages": [ToolMessage(f"booked {destination}", tool_call_id=tool_call_id,
                                         artifact={"ref": ref})]})

        @tool
        def print_ticket() -> str:
            """Print the ticket."""
            if next(desk.flaky_calls) == 1:
                raise RuntimeError("printer jammed")
            return "printed"

        return [book_flight, print_ticket]


def desk_agent(desk: Desk) -> StateGraph[Any, Any, Any, Any]:
    model = ScriptedModel(responses=[
        ask(("book_flight", {"destination": "Lisbon"}), ("print_ticket", {})), say("done")])
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(BookingState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode(desk.tools()))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


def desk_graph(desk: Desk, nested: bool) -> StateGraph[Any, Any, Any, Any]:
    if not nested:
        return desk_agent(desk)
    parent: StateGraph[Any, Any, Any, Any] = StateGraph(BookingState)
    parent.add_node("assistant", desk_agent(desk).compile())
    parent.add_edge(START, "assistant")
    parent.add_edge("assistant", END)
    return parent


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("nested", [False, True], ids=["top", "subgraph"])
def test_a_tool_that_returned_a_command_is_replayed_as_that_command(
        form: Form, nested: bool, saver_kind: str, tmp_path: Path) -> None:
    with saver_for(saver_kind, tmp_path) as saver:
        # on SQLite, the journal too: the Command is journaled as JSON and read back
        journal = SqliteJournal(tmp_path / "journal.db") if saver_kind == "sqlite" else None
        replays_a_command(form, nested, StateGuardCheckpointer(
            saver, journal=journal, compensations={"book_flight": lambda s, c: True},
            on_error="hold", compensation_retry=FAST_RETRY))


def replays_a_command(form: Form, nested: bool, guard: StateGuardCheckpointer) -> None:
    desk = Desk()
    builder = desk_graph(desk, nested)
    graph = builder.compile(checkpointer=guard) if form == "dropin" else guard.compile(builder)
    with pytest.raises(Exception, match="printer jammed"):
        if form == "dropin":
            graph.invoke(go(), config("cmd"), durability="sync")
        else:
            guard.invoke(graph, go(), config("cmd"))
    assert guard.status("cmd").run.status == RunStatus.FAILED
    assert desk.booked == ["Lisbon"]

    # LangGraph runs the tools task again: the booking is replayed, the ticket printed
    out = guard.retry(graph, config("cmd"))

    assert desk.booked == ["Lisbon"]  # the tool's body ran once
    assert out["booking"] == "BK-1"  # the Command's update, applied again
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.name, m.content) for m in answers] == [
        ("book_flight", "booked Lisbon"), ("print_ticket", "printed")]
    assert answers[0].artifact == {"ref": "BK-1"}
    assert out["messages"][-1].content == "done"
    view = guard.status("cmd")
    assert view.run.status == RunStatus.SUCCEEDED
    [booking] = [s for s in view.steps if s.node == "book_flight"]
    assert booking.status == StepStatus.SUCCEEDED and TOOL_TAG in booking.tags
    assert booking.update["artifact"] == {"ref": "BK-1"}
