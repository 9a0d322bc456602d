"""What a guard keeps for runs in a long-lived process: delete_thread forgets a thread's run,
InMemoryJournal keeps a bounded number of finished runs, and of each only what a later
compensation needs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stateguard import (
    Compensation,
    CompensationRetry,
    Effect,
    InMemoryJournal,
    RunNotFound,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    record_effect,
)
from tests.core.agent_support import Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config, line_builder, undo

NODES = ["charge", "ship"]


def charge_recording(state: dict[str, Any]) -> dict[str, Any]:
    record_effect(Effect("stripe", "charge", f"pi_{state.get('fail_at', 'ok')}", amount=100))
    return {}


def test_it_forgets_a_deleted_threads_run_in_the_journal(
        stores: dict[str, Any]) -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(stores["saver"], journal=stores["journal"],
                                   compensations={"charge": undo(effects, "charge")},
                                   compensation_retry=FAST_RETRY)
    graph = line_builder(NODES, effects, {"charge": charge_recording}).compile(
        checkpointer=guard)
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("gone"))
    graph.invoke({}, config("kept"))
    assert guard.status("gone").effects  # a step, a compensation and an effect to forget

    guard.delete_thread("gone")

    with pytest.raises(RunNotFound):
        guard.status("gone")
    assert graph.get_state(config("gone")).values == {}
    assert guard.status("kept").run.status == RunStatus.SUCCEEDED  # other threads untouched
    assert [e.effect.external_id for e in guard.status("kept").effects] == ["pi_ok"]
    # The thread starts afresh: a new saga, nothing of the old one left to undo.
    effects.clear()
    with pytest.raises(ValueError):
        graph.invoke({"fail_at": "ship"}, config("gone"))
    assert effects == ["charge", "undo:charge"]


def test_it_forgets_a_deleted_threads_run_when_deleted_from_async_code() -> None:
    guard = StateGuardCheckpointer()
    graph = guard.compile(line_builder(NODES, []))

    async def main() -> None:
        await guard.ainvoke(graph, {}, config("a"))
        await guard.adelete_thread("a")

    asyncio.run(main())
    with pytest.raises(RunNotFound):
        guard.status("a")


def test_it_keeps_a_bounded_number_of_finished_runs_in_memory() -> None:
    journal = InMemoryJournal(max_finished_runs=20)

    def refund_down(state: Any, ctx: Any) -> bool:
        raise ConnectionError("refunds down")

    guard = StateGuardCheckpointer(journal=journal, compensation_retry=FAST_RETRY,
                                   compensations={"charge": Compensation(
                                       refund_down, retry=CompensationRetry(attempts=1))})
    graph = guard.compile(line_builder(NODES, []))
    with pytest.raises(SagaAborted):  # needs attention: kept whatever the cap
        guard.invoke(graph, {"fail_at": "ship"}, config("owed"))
    for i in range(100):
        guard.invoke(graph, {}, config(f"t{i}"))

    kept = [i for i in range(100) if journal.run_get(f"t{i}") is not None]
    assert kept == list(range(80, 100))  # the 20 most recently finished
    assert guard.status("owed").run.status == RunStatus.NEEDS_ATTENTION
    assert len(journal._steps) == len(journal._runs) == 21


def test_it_keeps_every_run_when_told_to() -> None:
    journal = InMemoryJournal(max_finished_runs=None)
    guard = StateGuardCheckpointer(journal=journal)
    graph = guard.compile(line_builder(NODES, []))
    for i in range(30):
        guard.invoke(graph, {}, config(f"t{i}"))
    assert all(journal.run_get(f"t{i}") for i in range(30))


def test_it_refuses_a_cap_that_is_not_a_positive_number() -> None:
    with pytest.raises(ValueError, match="max_finished_runs"):
        InMemoryJournal(max_finished_runs=0)


def test_it_keeps_of_a_finished_run_what_a_later_compensation_needs_and_no_more() -> None:
    # A 2-tool agent kept 13.8 KiB per finished run: every step's state (the conversation, again
    # at every step) and the model's messages. bench/journal_memory.py measures it.
    world = Travel()
    guard = StateGuardCheckpointer(compensations={"charge_card": world.refund},
                                   compensation_retry=FAST_RETRY)
    graph = agent("v2", world, [ask(("charge_card", {"amount": 40_00})),
                                ask(("book_flight", {"destination": "Oslo"})), say("booked")],
                  checkpointer=guard)
    graph.invoke(go(), config("done"))

    steps = guard.status("done").steps
    assert [s.state_after for s in steps] == [None] * len(steps)
    kept = {s.node: s.update for s in steps if s.update is not None}
    assert list(kept) == ["charge_card"]  # the one step with a compensation
    assert kept["charge_card"]["content"] == '{"charge_id": "ch_1", "amount": 4000}'

    report = guard.compensate(graph, config("done"))  # an operator undoes a finished run

    assert report.compensated == ["charge_card"] and world.refunded == ["ch_1"]


def test_it_keeps_every_update_of_a_journal_the_caller_made() -> None:
    journal = InMemoryJournal()
    guard = StateGuardCheckpointer(journal=journal)
    graph = guard.compile(line_builder(NODES, []))
    guard.invoke(graph, {}, config("mine"))
    steps = guard.status("mine").steps
    assert [s.update for s in steps] == [{"log": ["charge"]}, {"log": ["ship"]}]
    assert [s.state_after for s in steps] == [None, None]
