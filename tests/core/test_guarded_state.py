"""GuardedState: the same saga for plain Python code."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stateguard import (
    GuardedState,
    InvalidRunState,
    InvariantViolation,
    RunLocked,
    RunStatus,
    SagaAborted,
    SqliteJournal,
    StepStatus,
)
from stateguard.postgres_journal import PostgresJournal
from tests.core.support import FAST_RETRY, undo


def no_negative_balance(state: dict[str, int]) -> bool:
    return state.get("balance", 0) >= 0


def test_it_unwinds_recorded_steps_in_reverse_order_on_an_exception() -> None:
    log: list[str] = []
    saga = GuardedState({"balance": 100}, run_id="g1", invariants=[no_negative_balance],
                        compensations={"reserve": undo(log, "reserve"),
                                       "charge": undo(log, "charge")},
                        compensation_retry=FAST_RETRY)
    with pytest.raises(SagaAborted) as caught, saga:
        saga.step("reserve", lambda s: {"reserved": True})
        saga.step("charge", lambda s: {"balance": s["balance"] - 30})
        raise TimeoutError("courier API timed out")

    assert log == ["undo:charge", "undo:reserve"]
    assert isinstance(caught.value.cause, TimeoutError)
    assert saga.state == {"balance": 70, "reserved": True}


def test_it_stops_at_a_violating_step_and_compensates_it() -> None:
    log: list[str] = []
    saga = GuardedState({"balance": 10}, run_id="g2", invariants=[no_negative_balance],
                        compensations={"charge": undo(log, "charge")})
    with pytest.raises(SagaAborted) as caught, saga:
        saga.step("charge", lambda s: {"balance": s["balance"] - 30})
        log.append("never reached")
    assert log == ["undo:charge"]
    assert isinstance(caught.value.cause, InvariantViolation)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_it_succeeds_and_journals_every_step(kind: str, tmp_path: Path,
                                             request: pytest.FixtureRequest) -> None:
    journal = SqliteJournal(tmp_path / "j.db") if kind == "sqlite" else \
        request.getfixturevalue("pg_journal")
    with GuardedState({"n": 0}, run_id="g3", journal=journal) as saga:
        saga.step("one", lambda s: {"n": s["n"] + 1})
        saga.step("two", lambda s: {"n": s["n"] + 1})
    assert saga.state == {"n": 2}
    assert journal.run_get("g3").status == RunStatus.SUCCEEDED  # type: ignore[union-attr]
    assert [(s.node, s.state_after) for s in journal.steps("g3")] == [
        ("one", {"n": 1}), ("two", {"n": 2})]


def test_it_rejects_a_step_that_returns_no_dict() -> None:
    with pytest.raises(SagaAborted, match="returns a dict"), \
            GuardedState(run_id="g4") as saga:
        saga.step("bad", lambda s: 42)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_it_recovers_a_run_left_in_doubt_from_another_guard(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    log: list[str] = []
    # What a process that died inside step "b" leaves behind: its expired lease, step "a"
    # done, step "b" started.
    if kind == "sqlite":
        journal, other = SqliteJournal(tmp_path / "j.db"), SqliteJournal(tmp_path / "j.db")
    else:  # the same schema, as another process opens it
        journal = request.getfixturevalue("pg_journal")
        other = PostgresJournal(request.getfixturevalue("pg_journal_db"), schema=journal.schema)
        request.addfinalizer(other.close)
    journal.lock_acquire("g5", "dead-process", 0.01)
    journal.step_start("g5", "1:a", "a")
    journal.step_finish("g5", "1:a", StepStatus.SUCCEEDED, state_after={"a": 1})
    journal.step_start("g5", "2:b", "b")
    time.sleep(0.02)

    second = GuardedState(run_id="g5", journal=other,
                          compensations={"a": undo(log, "a"), "b": undo(log, "b")})
    report = second.compensate(by="recovery", reason="crash")
    assert log == ["undo:a"]
    assert report.needs_attention  # b was in doubt and its compensation is not in_doubt_safe


def test_it_refuses_a_second_holder_of_the_same_run() -> None:
    journal_holder = GuardedState(run_id="g6")
    with journal_holder, pytest.raises(RunLocked):
        GuardedState(run_id="g6", journal=journal_holder.core.journal).__enter__()


async def test_it_runs_async_steps() -> None:
    log: list[str] = []

    async def charge(state: dict[str, int]) -> dict[str, int]:
        return {"balance": state["balance"] - 5}

    saga = GuardedState({"balance": 1}, run_id="g7", invariants=[no_negative_balance],
                        compensations={"charge": undo(log, "charge")})
    with pytest.raises(SagaAborted):
        async with saga:
            await saga.astep("charge", charge)
    assert log == ["undo:charge"]


def test_it_refuses_to_compensate_a_run_already_settled() -> None:
    log: list[str] = []
    saga = GuardedState(run_id="g8", compensations={"a": undo(log, "a")})
    with pytest.raises(SagaAborted), saga:
        saga.step("a", lambda s: {"a": 1})
        raise ValueError("b failed")
    saga.core.journal.run_set_status("g8", RunStatus.COMPENSATED)  # resolved by hand, say
    with pytest.raises(InvalidRunState, match="is compensated"):
        saga.compensate(by="carol")
    assert log == ["undo:a"]  # undone once, by the failure; not again
