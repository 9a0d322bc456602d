"""Plain runs: builder.compile(checkpointer=guard) (the drop-in form), or a guarded graph, run by
LangGraph's own invoke/stream/ainvoke/astream (stateguard.plain_runs)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import warnings
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import EmptyInputError
from langgraph.graph import START, StateGraph
from langgraph.pregel._loop import PregelLoop

from stateguard import (
    Compensation,
    ConfigurationError,
    InMemoryJournal,
    InvalidRunState,
    InvariantViolation,
    RunLocked,
    RunStatus,
    StateGuardCheckpointer,
)
from stateguard.instrument import wrapped_node
from tests.core.support import FAST_RETRY, LineState, config, line_builder, undo

NODES = ["reserve", "charge", "email", "ship"]


def no_negative_balance(state: dict[str, int]) -> bool:
    return state.get("balance", 0) >= 0


def make(effects: list[str], **kwargs: Any) -> StateGuardCheckpointer:
    return StateGuardCheckpointer(
        invariants=[no_negative_balance],
        compensations={n: undo(effects, n) for n in ("reserve", "charge", "email")},
        compensation_retry=FAST_RETRY, **kwargs)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_it_compensates_before_the_node_error_reaches_the_caller(durability: str) -> None:
    effects: list[str] = []
    guard = make(effects)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)

    with warnings.catch_warnings(), pytest.raises(ValueError, match="ship failed") as caught:
        warnings.simplefilter("error")  # no mode of LangGraph's is "degraded" any more
        graph.invoke({"fail_at": "ship"}, config("d1"), durability=durability)

    assert effects == ["reserve", "charge", "email", "undo:email", "undo:charge", "undo:reserve"]
    report = caught.value.stateguard_report  # type: ignore[attr-defined]
    assert report.compensated == ["email", "charge", "reserve"]
    assert any("StateGuard" in note for note in caught.value.__notes__)
    assert guard.status("d1").run.status == RunStatus.COMPENSATED


def test_it_wraps_the_graphs_nodes_the_first_time_it_runs_and_no_other_graph() -> None:
    effects: list[str] = []
    guard = make(effects)
    builder = line_builder(NODES, effects)
    graph = builder.compile(checkpointer=guard)
    elsewhere = builder.compile(checkpointer=InMemorySaver())
    assert not any(wrapped_node(n.bound) for n in graph.nodes.values())

    graph.invoke({}, config("w"))

    assert all(wrapped_node(graph.nodes[name].bound) for name in NODES)
    assert not any(wrapped_node(n.bound) for n in elsewhere.nodes.values())
    assert [s.node for s in guard.status("w").steps] == NODES
    elsewhere.invoke({}, config("w2"))
    assert guard.journal.run_get("w2") is None


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
    assert guard.journal.run_get("d5") is None


def test_it_gates_a_drop_in_graphs_node_until_approved() -> None:
    effects: list[str] = []
    guard = make(effects, approvals=["charge"])
    graph = line_builder(NODES, effects).compile(checkpointer=guard)

    out = graph.invoke({}, config("gate"))

    assert "__interrupt__" in out and effects == ["reserve"]
    assert guard.status("gate").run.status == RunStatus.PAUSED
    guard.approve(graph, config("gate"), by="alice")
    assert effects == NODES
    assert guard.status("gate").run.status == RunStatus.SUCCEEDED


def test_it_refuses_a_run_of_a_thread_another_caller_is_running() -> None:
    effects: list[str] = []
    guard = make(effects)
    inside, release = threading.Event(), threading.Event()

    def slow_email(state: dict[str, Any]) -> dict[str, Any]:
        inside.set()
        assert release.wait(10)
        return {}

    graph = line_builder(NODES, effects, {"email": slow_email}).compile(checkpointer=guard)
    first = threading.Thread(target=graph.invoke, args=({}, config("busy")))
    first.start()
    try:
        assert inside.wait(10)
        with pytest.raises(RunLocked):  # two callers would run the next node twice
            graph.invoke(None, config("busy"))
    finally:
        release.set()
        first.join(10)
    assert effects == NODES  # each node once
    assert guard.journal.run_get("busy").lock_owner is None  # type: ignore[union-attr]


def loops_alive() -> int:
    gc.collect()
    return sum(isinstance(o, PregelLoop) for o in gc.get_objects())


def test_it_keeps_nothing_of_a_run_once_it_ends_however_it_ends() -> None:
    effects: list[str] = []
    guard = make(effects)
    builder = line_builder(NODES, effects, {"charge": lambda s: {"balance": s["balance"] - 5}})
    graph = builder.compile(checkpointer=guard)
    paused = builder.compile(checkpointer=guard, interrupt_before=["ship"])
    before = loops_alive()
    with contextlib.suppress(ValueError):
        graph.invoke({"balance": 10, "fail_at": "ship"}, config("error"))
    with contextlib.suppress(InvariantViolation):
        graph.invoke({"balance": 0}, config("violation"))
    graph.invoke({"balance": 10}, config("turns"))
    graph.invoke({"balance": 10}, config("turns"))
    paused.invoke({"balance": 10}, config("paused"))
    paused.invoke(None, config("paused"))
    asyncio.run(graph.ainvoke({"balance": 10}, config("async")))
    for _ in graph.stream({"balance": 10}, config("stopped")):
        break  # its consumer stopped: the run is left running, for recovery
    for i in range(3):  # LangGraph refuses the start after get_tuple: its loop never exits
        with pytest.raises(EmptyInputError):
            graph.invoke(None, config(f"rejected-{i}"))

    assert loops_alive() == before
    runs = ["error", "violation", "turns", "paused", "async", "stopped"] + [
        f"rejected-{i}" for i in range(3)]
    assert [guard.journal.run_get(r).lock_owner for r in runs] == [None] * len(runs)  # type: ignore[union-attr]
    assert guard.status("stopped").run.status == RunStatus.RUNNING
    assert guard.recover(graph, config("stopped")).compensated == ["reserve"]  # ran, then stop


def test_it_keeps_a_run_until_its_loop_exits_when_cancelled_twice() -> None:
    # anyio cancel scopes and a Starlette client disconnect cancel again while LangGraph's
    # loop waits in __aexit__: the turn is left running, and the lease is released.
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"charge": undo(effects, "charge")})

    async def main() -> None:
        inside = asyncio.Event()

        async def charge(state: dict[str, Any]) -> dict[str, Any]:
            effects.append("charge")
            return {"log": ["charge"]}

        async def email(state: dict[str, Any]) -> dict[str, Any]:
            inside.set()
            await asyncio.sleep(30)
            return {}

        builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
        builder.add_sequence([charge, email])
        builder.add_edge(START, "charge")
        graph = builder.compile(checkpointer=guard)
        run = asyncio.create_task(graph.ainvoke({}, config("c")))
        await asyncio.wait_for(inside.wait(), 10)
        run.cancel()
        await asyncio.sleep(0)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(main())
    view = guard.status("c")
    assert (view.run.status, view.run.lock_owner) == (RunStatus.RUNNING, None)
    assert [s.node for s in view.in_doubt] == ["email"]
    assert loops_alive() == 0


def test_it_refuses_new_input_on_a_turn_that_owes_an_undo() -> None:
    effects: list[str] = []
    guard = make(effects, on_error="hold")
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("held"))
    assert guard.status("held").run.status == RunStatus.FAILED

    with pytest.raises(InvalidRunState, match=r"\['charge', 'email', 'reserve'\]"):
        graph.invoke({}, config("held"))  # would leave the charge behind
    assert effects == ["reserve", "charge", "email"]

    guard.compensate(graph, config("held"))  # settled: the thread goes on
    graph.invoke({"fail_at": ""}, config("held"))
    assert guard.status("held").run.turn == 2


def test_it_refuses_a_thread_that_needs_attention_until_it_is_resolved() -> None:
    effects: list[str] = []
    down = {"stripe": True}

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        if down["stripe"]:
            raise ConnectionError("stripe unreachable")
        effects.append("undo:charge")
        return True

    guard = StateGuardCheckpointer(compensations={"charge": refund},
                                   compensation_retry=FAST_RETRY)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("att"))
    assert guard.status("att").run.status == RunStatus.NEEDS_ATTENTION
    with pytest.raises(InvalidRunState, match="needs_attention"):
        graph.invoke({}, config("att"))
    with pytest.raises(ConfigurationError, match="note"):
        guard.resolve(graph, config("att"), note=" ")

    guard.resolve(graph, config("att"), by="carol", note="refunded in Stripe's dashboard")

    assert guard.status("att").run.status == RunStatus.COMPENSATED
    graph.invoke({"fail_at": ""}, config("att"))  # the next turn
    assert guard.status("att").run.turn == 2


@pytest.mark.parametrize("action", ["compensate", "retry_compensation", "acompensate",
                                    "aretry_compensation"])
def test_it_retries_a_drop_in_runs_failed_compensation(action: str) -> None:
    effects: list[str] = []
    down = {"stripe": True}

    async def refund(state: dict[str, Any], ctx: Any) -> bool:
        if down["stripe"]:
            raise ConnectionError("stripe unreachable")
        effects.append("undo:charge")
        return True

    guard = StateGuardCheckpointer(compensations={"charge": Compensation(refund)},
                                   compensation_retry=FAST_RETRY)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("r"))
    down["stripe"] = False
    step = next(s.step_id for s in guard.status("r").steps if s.node == "charge")

    if action == "compensate":
        report = guard.compensate(graph, config("r"))
    elif action == "retry_compensation":
        report = guard.retry_compensation(graph, config("r"), step)
    elif action == "acompensate":
        report = asyncio.run(guard.acompensate(graph, config("r")))
    else:
        report = asyncio.run(guard.aretry_compensation(graph, config("r"), step))

    assert report.compensated == ["charge"] and effects.count("undo:charge") == 1
    assert guard.status("r").run.status == RunStatus.COMPENSATED


def test_it_refuses_a_durability_that_delays_a_deferring_journals_rows() -> None:
    # A journal that writes its step rows with the saver's checkpoint writes (the web app's on
    # PostgreSQL) keeps them only with "sync": refused before any node, never lost.
    effects: list[str] = []
    journal = InMemoryJournal()
    journal.defers_steps = True  # type: ignore[attr-defined]
    saver = InMemorySaver()
    saver.journal = journal  # type: ignore[attr-defined]
    guard = StateGuardCheckpointer(saver, journal=journal)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    for durability in ("async", "exit"):
        with pytest.raises(ConfigurationError, match="durability='sync'"):
            graph.invoke({}, config(durability), durability=durability)
    assert effects == []
    graph.invoke({}, config("sync"), durability="sync")
    assert effects == NODES
