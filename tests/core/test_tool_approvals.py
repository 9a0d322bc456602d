"""Approvals keyed by a tool's name gate one call, before it runs, with its arguments as the
payload, in both forms; only approve/reject decide one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from stateguard import ApprovalStatus, InvalidRunState, RunStatus, StateGuardCheckpointer
from tests.core.agent_support import SHAPES, Shape, Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config, line_builder
from tests.core.tool_forms import saver_for


def gated(world: Travel, saver: Any = None) -> StateGuardCheckpointer:
    return StateGuardCheckpointer(
        saver, compensations={"charge_card": world.refund, "inventory": world.release},
        approvals={"charge_card": lambda args: args["amount"] > 100_00},
        compensation_retry=FAST_RETRY)


def script() -> list[Any]:
    # the seat and the charge in one message: in v1 one task runs both, and resuming the task
    # after the approval must not hold the seat twice
    return [ask(("reserve_seat", {"seat": "12A"}), ("charge_card", {"amount": 150_00})),
            say("paid")]


@pytest.mark.parametrize("saver_kind", ["memory", "sqlite"])
@pytest.mark.parametrize("shape", SHAPES)
def test_it_pauses_before_the_call_and_charges_once_when_approved(
        shape: Shape, saver_kind: str, tmp_path: Path) -> None:
    world = Travel()
    with saver_for(saver_kind, tmp_path) as saver:
        guard = gated(world, saver)
        graph = guard.compile(agent(shape, world, script()))
        out = guard.invoke(graph, go(), config("big"))

        assert "__interrupt__" in out
        assert world.charges == [] and world.seats == ["12A"]
        [approval] = guard.status("big").pending_approvals
        assert approval.node == "charge_card"
        assert approval.payload == {"tool": "charge_card", "tool_call_id": "charge_card-2",
                                    "args": {"amount": 150_00}}
        assert guard.status("big").run.status == RunStatus.PAUSED

        out = guard.approve(graph, config("big"), by="alice")

        assert out["messages"][-1].content == "paid"
        assert [amount for _, amount in world.charges] == [150_00]
        assert world.seats == ["12A"]  # the seat's call was replayed, not run again
        view = guard.status("big")
        assert view.run.status == RunStatus.SUCCEEDED
        assert [a.status for a in view.approvals] == [ApprovalStatus.APPROVED]


@pytest.mark.parametrize("shape", SHAPES)
def test_it_charges_nothing_and_unwinds_what_came_before_when_rejected(shape: Shape) -> None:
    world = Travel()
    guard = gated(world)
    graph = guard.compile(agent(shape, world, script()))
    guard.invoke(graph, go(), config("no"))

    report = guard.reject(graph, config("no"), by="bob", reason="too much")

    assert world.charges == [] and world.seats == []
    assert report.compensated == ["reserve_seat"]
    assert guard.status("no").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("shape", SHAPES)
def test_it_lets_a_call_under_the_threshold_through(shape: Shape) -> None:
    world = Travel()
    guard = gated(world)
    graph = guard.compile(agent(shape, world, [ask(("charge_card", {"amount": 50_00})),
                                               say("paid")]))
    out = guard.invoke(graph, go(), config("small"))
    assert out["messages"][-1].content == "paid" and len(world.charges) == 1
    assert guard.status("small").approvals == []


def test_it_validates_approvals_against_the_tools() -> None:
    from stateguard import ConfigurationError

    world = Travel()
    guard = StateGuardCheckpointer(approvals={"charge_cards": None})
    with pytest.raises(ConfigurationError, match="approvals name no node or tool"):
        guard.compile(agent("v2", world, [say("hi")]))


def test_it_gates_the_calls_of_a_tool_by_its_tag() -> None:
    world = Travel()
    guard = StateGuardCheckpointer(compensations={"inventory": world.release},
                                   approvals={"inventory": None})  # reserve_seat's tag
    graph = guard.compile(agent("v2", world, [ask(("reserve_seat", {"seat": "3C"})),
                                              say("held")]))
    guard.invoke(graph, go(), config("tagged"))
    [approval] = guard.status("tagged").pending_approvals
    assert approval.node == "reserve_seat" and world.seats == []

    guard.approve(graph, config("tagged"), by="alice")
    assert world.seats == ["3C"]


def resume_by_hand(way: str, guard: StateGuardCheckpointer, graph: Any, thread: str) -> None:
    """Send ``Command(resume=True)`` to a paused run, one of the ways a caller can."""
    command, cfg = Command(resume=True), config(thread)
    if way == "runner":
        guard.invoke(graph, command, cfg)
    elif way == "invoke":
        graph.invoke(command, cfg)
    elif way == "stream":
        list(graph.stream(command, cfg))
    elif way == "ainvoke":
        asyncio.run(graph.ainvoke(command, cfg))
    else:
        async def drain() -> None:
            async for _ in graph.astream(command, cfg):
                pass
        asyncio.run(drain())


@pytest.mark.parametrize("way", ["runner", "invoke", "stream", "ainvoke", "astream"])
@pytest.mark.parametrize("form", ["dropin", "guarded"])
@pytest.mark.parametrize("shape", SHAPES)
def test_it_opens_a_tool_gate_only_by_approve_however_it_is_resumed(
        shape: Shape, form: str, way: str) -> None:
    world = Travel()
    guard = gated(world)
    graph = (agent(shape, world, script(), checkpointer=guard) if form == "dropin"
             else guard.compile(agent(shape, world, script())))
    graph.invoke(go(), config("gate"))

    for _ in range(2):  # a second resume used to run the charge
        with pytest.raises(InvalidRunState, match="approve"):
            resume_by_hand(way, guard, graph, "gate")

    assert world.charges == []
    view = guard.status("gate")
    assert view.run.status == RunStatus.PAUSED
    assert [a.status for a in view.approvals] == [ApprovalStatus.PENDING]
    guard.approve(graph, config("gate"), by="alice")
    assert [amount for _, amount in world.charges] == [150_00]


@pytest.mark.parametrize("shape", SHAPES)
def test_it_pauses_a_tool_gate_again_for_resume_values_that_slip_past_the_refusal(
        shape: Shape, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Travel()
    guard = gated(world)
    monkeypatch.setattr(guard, "refuse_gated_resume", lambda run_id, paused: None)
    graph = guard.compile(agent(shape, world, script()))
    graph.invoke(go(), config("slip"))
    for _ in range(3):
        assert "__interrupt__" in graph.invoke(Command(resume=True), config("slip"))
    assert world.charges == []
    assert guard.status("slip").approvals[0].status == ApprovalStatus.PENDING


@pytest.mark.parametrize("way", ["runner", "invoke", "stream", "ainvoke", "astream"])
@pytest.mark.parametrize("form", ["dropin", "guarded"])
def test_it_opens_a_node_gate_only_by_approve_however_it_is_resumed(form: str,
                                                                      way: str) -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["charge"])
    builder = line_builder(["reserve", "charge"], effects)
    graph = (builder.compile(checkpointer=guard) if form == "dropin"
             else guard.compile(builder))
    graph.invoke({}, config("gate"))

    for _ in range(2):
        with pytest.raises(InvalidRunState, match="approve"):
            resume_by_hand(way, guard, graph, "gate")

    assert effects == ["reserve"]
    guard.approve(graph, config("gate"), by="alice")
    assert effects == ["reserve", "charge"]
