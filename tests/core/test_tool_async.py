"""Agents with tools under asyncio (ainvoke): ToolNode's async path goes through StateGuard's
async tool-call wrapper, in both forms."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.prebuilt import ToolNode, create_react_agent

from stateguard import RunStatus, SagaAborted, ToolCallFailed
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
from tests.core.support import config
from tests.core.tool_forms import FORMS, Form, make_guard


@pytest.mark.parametrize("handle_tool_errors", [None, True])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
async def test_it_refunds_the_charge_once_under_ainvoke(
        shape: Shape, form: Form, handle_tool_errors: bool | None) -> None:
    world = Travel()
    guard = make_guard(world)
    script = [ask(("charge_card", {"amount": 4200})),
              ask(("book_flight", {"destination": "nowhere"})), say("booked")]
    with pytest.raises((BookingFailed, SagaAborted, ToolCallFailed)) as caught:
        if form == "dropin":
            graph = agent(shape, world, script, checkpointer=guard,
                          handle_tool_errors=handle_tool_errors)
            await graph.ainvoke(go(), config("async"), durability="sync")
        else:
            graph = guard.compile(agent(shape, world, script,
                                        handle_tool_errors=handle_tool_errors))
            await guard.ainvoke(graph, go(), config("async"))

    if handle_tool_errors:  # told to the model, unwound by the default policy
        assert "ToolCallFailed" in repr(caught.value)
    assert world.refunded == [world.charges[0][0]]
    assert guard.status("async").run.status == RunStatus.COMPENSATED


@pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")
async def test_it_keeps_the_users_own_tool_wrapper() -> None:
    world = Travel()
    seen: list[str] = []

    async def audit(request: Any, execute: Any) -> Any:
        seen.append(request.tool_call["name"])
        return await execute(request)

    guard = make_guard(world)
    tools = ToolNode(world.tools(), awrap_tool_call=audit)
    model = ScriptedModel(responses=[ask(("charge_card", {"amount": 100})), say("ok")])
    graph = guard.compile(create_react_agent(model, tools))
    await guard.ainvoke(graph, go(), config("wrapped"))

    assert seen == ["charge_card"] and len(world.charges) == 1
    assert [s.node for s in guard.status("wrapped").steps if s.node == "charge_card"] == [
        "charge_card"]
