"""Ways to misuse a guard that must neither repeat an effect nor skip a compensation."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.types import Command

from stateguard import (
    ApprovalStatus,
    Compensation,
    CompensationRetry,
    ConfigurationError,
    GuardedState,
    InvalidRunState,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from tests.core.support import config, fork_builder, line_builder, undo

NODES = ["a", "b", "c"]


class Counter(TypedDict, total=False):
    total: Annotated[int, operator.add]


def test_it_keeps_the_gate_closed_when_resumed_with_a_command() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["c"])
    graph = guard.compile(line_builder(NODES, effects))
    guard.invoke(graph, {}, config("cmd"))

    for _ in range(2):  # through the runner, and around it: refused before any node runs
        with pytest.raises(InvalidRunState, match="approve"):
            guard.invoke(graph, Command(resume=True), config("cmd"))
        with pytest.raises(InvalidRunState, match="approve"):
            graph.invoke(Command(resume=True), config("cmd"))
    assert effects == ["a", "b"]
    assert guard.status("cmd").approvals[0].status == ApprovalStatus.PENDING

    guard.approve(graph, config("cmd"), by="alice")
    assert effects == ["a", "b", "c"]


@pytest.mark.parametrize("resumes", [1, 2, 3])
def test_it_pauses_again_however_many_resume_values_reach_the_gate(
        resumes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Were a resume value to slip past the refusal, the gate itself still asks the journal
    # after each one: LangGraph hands the n-th value to the n-th interrupt() of the task.
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["c"])
    monkeypatch.setattr(guard, "refuse_gated_resume", lambda run_id, paused: None)
    graph = guard.compile(line_builder(NODES, effects))
    graph.invoke({}, config("slip"))
    for _ in range(resumes):
        out = graph.invoke(Command(resume=True), config("slip"))
        assert "__interrupt__" in out
    assert effects == ["a", "b"]
    assert guard.status("slip").run.status == RunStatus.PAUSED
    assert guard.status("slip").approvals[0].status == ApprovalStatus.PENDING
    guard.approve(graph, config("slip"), by="alice")
    assert effects == ["a", "b", "c"]


def test_it_refuses_a_new_turn_on_a_thread_whose_turn_is_held_failed() -> None:
    # A held turn waits for an operator (retry or compensate); a new turn from the input would
    # leave its effects behind. (A turn that succeeded or was compensated is settled: the
    # next invoke is a new turn, see test_threads.)
    effects: list[str] = []
    guard = StateGuardCheckpointer(compensations={"a": undo(effects, "a")}, on_error="hold")
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(ValueError):
        guard.invoke(graph, {"fail_at": "c"}, config("again"))
    with pytest.raises(InvalidRunState, match="already ran"):
        guard.invoke(graph, {}, config("again"))
    assert effects == ["a", "b"]


def test_it_does_not_unwind_when_the_call_itself_is_wrong() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(approvals=["c"], compensations={"a": undo(effects, "a")})
    graph = guard.compile(line_builder(NODES, effects))
    guard.invoke(graph, {}, config("kw"))
    with pytest.raises(ConfigurationError, match="durability"):
        guard.invoke(graph, None, config("kw2"), durability="async")
    with pytest.raises(ConfigurationError, match="thread_id"):
        guard.invoke(graph, {}, None)  # type: ignore[arg-type]
    assert effects == ["a", "b"]  # nothing unwound


def test_it_compensates_a_step_whose_result_cannot_be_applied() -> None:
    effects: list[str] = []
    builder = StateGraph(Counter)
    builder.add_node("charge", lambda s: effects.append("charge") or {"total": "ten"})
    builder.add_edge(START, "charge")
    guard = StateGuardCheckpointer(compensations={"charge": undo(effects, "charge")})
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(guard.compile(builder), {"total": 1}, config("reducer"))
    assert isinstance(caught.value.cause, TypeError)
    assert effects == ["charge", "undo:charge"]


def test_it_refuses_to_resume_over_a_step_in_doubt_unless_forced() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(on_error="hold")
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(ValueError):
        guard.invoke(graph, {"fail_at": "c"}, config("doubt"))
    # as if a process had died inside c on an earlier attempt
    guard.journal.step_start("doubt", "ghost", "c")
    with pytest.raises(InvalidRunState, match="in doubt"):
        guard.retry(graph, config("doubt"))
    assert guard.status("doubt").in_doubt[0].status == StepStatus.STARTED


def test_it_refuses_to_continue_a_drop_in_thread_that_needs_attention() -> None:
    # Its effect could not be undone: an operator settles it first. (A compensated turn is
    # settled: the next invoke is a new turn, see test_threads.)
    effects: list[str] = []

    def refund_down(state: Any, ctx: Any) -> bool:
        raise ConnectionError("refunds down")

    guard = StateGuardCheckpointer(compensations={"a": refund_down},
                                   compensation_retry=CompensationRetry(attempts=1))
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "c"}, config("dropin-again"))
    with pytest.raises(InvalidRunState, match="needs_attention"):
        graph.invoke(None, config("dropin-again"))
    assert effects == ["a", "b"]
    graph.get_state(config("dropin-again"))  # reading the state is still fine


def test_it_keeps_each_drop_in_graphs_tags_apart() -> None:
    effects: list[str] = []
    tagged = StateGraph(Counter)
    tagged.add_node("pay", lambda s: effects.append("pay") or {}, metadata={"tags": ["money"]})

    def boom(state: Any) -> Any:
        raise ValueError("boom")

    tagged.add_node("ship", boom)
    tagged.add_edge(START, "pay")
    tagged.add_edge("pay", "ship")
    plain = StateGraph(Counter)
    plain.add_node("money", lambda s: {})
    plain.add_edge(START, "money")
    guard = StateGuardCheckpointer(compensations={"money": undo(effects, "money")})
    g1, g2 = tagged.compile(checkpointer=guard), plain.compile(checkpointer=guard)
    g2.invoke({}, config("plain-1"))
    with pytest.raises(ValueError):
        g1.invoke({}, config("tagged-1"))
    assert effects == ["pay", "undo:money"]


@pytest.mark.parametrize("make", [
    lambda: CompensationRetry(attempts=2.5),  # type: ignore[arg-type]
    lambda: CompensationRetry(initial="1"),  # type: ignore[arg-type]
    lambda: Compensation(print, retry=3),  # type: ignore[arg-type]
    lambda: StateGuardCheckpointer(lease_ttl="60"),  # type: ignore[arg-type]
    lambda: StateGuardCheckpointer(lease_ttl=1, lease_heartbeat=2),
    lambda: GuardedState(run_id=""),
])
def test_it_rejects_values_of_the_wrong_type(make: Any) -> None:
    with pytest.raises(ConfigurationError):
        make()


def test_it_refuses_steps_outside_the_block() -> None:
    saga = GuardedState(run_id="outside")
    with saga:
        saga.step("a", lambda s: {"a": 1})
    with pytest.raises(InvalidRunState):
        saga.step("b", lambda s: {"b": 1})


async def test_it_runs_async_compensations_from_a_sync_unwind_inside_an_event_loop() -> None:
    effects: list[str] = []

    async def refund(state: Any, ctx: Any) -> bool:
        await asyncio.sleep(0)
        effects.append("refund")
        return True

    guard = StateGuardCheckpointer(compensations={"a": refund}, on_error="hold")
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(ValueError):
        guard.invoke(graph, {"fail_at": "b"}, config("loop"))
    report = guard.compensate(graph, config("loop"))  # sync call, a loop is running here
    assert effects == ["a", "refund"] and not report.needs_attention


def test_it_closes_pending_approvals_when_a_run_unwinds() -> None:
    effects: list[str] = []
    builder = fork_builder(effects, "ship")  # ship is gated, book fails next to it
    guard = StateGuardCheckpointer(approvals=["ship"],
                                   compensations={"charge": undo(effects, "charge")})
    graph = guard.compile(builder)
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {}, config("par-gate"))
    assert guard.status("par-gate").approvals[0].status == ApprovalStatus.REJECTED
    with pytest.raises(InvalidRunState, match="paused"):
        guard.approve(graph, config("par-gate"), by="alice")
    assert effects == ["charge", "undo:charge"]  # the gated node never ran


def test_it_does_not_let_a_stale_lease_holder_take_a_released_run_back() -> None:
    from stateguard import InMemoryJournal

    journal = InMemoryJournal()
    assert journal.lock_acquire("r", "stalled-worker", 0.01)
    import time

    time.sleep(0.02)
    assert journal.lock_acquire("r", "recovery", 10)
    journal.lock_release("r", "recovery")
    assert not journal.lock_renew("r", "stalled-worker", 10)  # its heartbeat finds it lost
    assert journal.lock_acquire("r", "next", 10)
