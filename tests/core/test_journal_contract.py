"""The rules every Journal keeps (stateguard/journal.py), checked on each shipped journal.
The Django journal runs the same rules in tests/web/test_journal.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stateguard import InMemoryJournal, Journal, SqliteJournal
from stateguard.journal import AbandonedRunsJournal, StepLookupJournal, find_step
from stateguard.records import (
    ApprovalRecord,
    ApprovalStatus,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    RunStatus,
    StepStatus,
)

Factory = Callable[[pytest.FixtureRequest, Path], Journal]
JOURNALS: dict[str, Factory] = {
    "in-memory": lambda request, tmp: InMemoryJournal(),
    "sqlite": lambda request, tmp: SqliteJournal(tmp / "journal.db"),
    # A schema of the test's own in its pytest-xdist worker's database (conftest.py).
    "postgres": lambda request, tmp: request.getfixturevalue("pg_journal"),
}


@pytest.fixture(params=list(JOURNALS))
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Journal:
    return JOURNALS[request.param](request, tmp_path)


def test_it_gives_a_lock_to_one_owner_at_a_time(journal: Journal) -> None:
    assert journal.lock_acquire("r", "a", 0.05)
    assert journal.lock_acquire("r", "a", 0.05)  # the holder may extend it
    assert not journal.lock_acquire("r", "b", 10)
    assert journal.lock_renew("r", "a", 0.05)
    time.sleep(0.06)
    assert journal.lock_acquire("r", "b", 10)  # expired: taken over
    assert not journal.lock_renew("r", "a", 10)  # and never taken back by a renewal
    journal.lock_release("r", "a")  # not the holder: no effect
    assert not journal.lock_acquire("r", "c", 10)
    journal.lock_release("r", "b")
    assert not journal.lock_renew("r", "b", 10)  # released: nothing to renew
    assert journal.lock_acquire("r", "c", 10)


def test_it_numbers_attempts_and_reports_a_step_left_in_doubt(journal: Journal) -> None:
    journal.run_begin("r")
    step, previous = journal.step_start("r", "t1", "charge", ("payment",))
    assert (step.attempt, previous) == (1, None)
    step, previous = journal.step_start("r", "t1", "charge", ("payment",))  # never finished
    assert (step.attempt, previous) == (2, StepStatus.STARTED)
    journal.step_finish("r", "t1", StepStatus.SUCCEEDED, update={"id": "ch_1"},
                        state_after={"id": "ch_1"})
    journal.step_start("r", "t2", "ship")
    journal.step_finish("r", "t2", StepStatus.FAILED)
    journal.step_start("r", "t3", "notify")
    journal.step_finish("r", "t3", StepStatus.VIOLATED)
    steps = {s.step_id: s for s in journal.steps("r")}
    assert steps["t1"].tags == ("payment",) and steps["t1"].state_after == {"id": "ch_1"}
    assert [steps[t].done_seq for t in ("t1", "t2", "t3")] == [1, None, 2]


def test_it_keeps_one_compensation_record_per_step_with_every_attempt(journal: Journal) -> None:
    journal.run_begin("r")
    journal.step_start("r", "t1", "charge")
    record = CompensationRecord("r", "t1", "charge", "sg-key")
    first = journal.compensation_begin(record)
    journal.compensation_attempt("r", "t1", AttemptRecord(1, 1.0, 2.0, False),
                                 CompensationStatus.RUNNING)
    again = journal.compensation_begin(CompensationRecord("r", "t1", "charge", "other-key"))
    assert again.idempotency_key == first.idempotency_key == "sg-key"
    journal.compensation_attempt("r", "t1", AttemptRecord(2, 3.0, 4.0, True, "True"),
                                 CompensationStatus.SUCCEEDED)
    (comp,) = journal.compensations("r")
    assert comp.status == CompensationStatus.SUCCEEDED
    assert [(a.number, a.ok) for a in comp.attempts] == [(1, False), (2, True)]


def test_it_keeps_when_a_waiting_compensation_is_tried_again(journal: Journal) -> None:
    journal.run_begin("r")
    journal.step_start("r", "t1", "charge")
    journal.compensation_begin(CompensationRecord("r", "t1", "charge", "sg-key"))
    journal.compensation_attempt("r", "t1", AttemptRecord(1, 1.0, 2.0, False),
                                 CompensationStatus.WAITING, retry_at=32.5)
    assert [(c.status, c.retry_at) for c in journal.compensations("r")] == [
        (CompensationStatus.WAITING, 32.5)]
    journal.compensation_attempt("r", "t1", AttemptRecord(2, 33.0, 34.0, True, "True"),
                                 CompensationStatus.SUCCEEDED)
    assert [(c.status, c.retry_at) for c in journal.compensations("r")] == [
        (CompensationStatus.SUCCEEDED, None)]


def test_it_decides_an_approval_once(journal: Journal) -> None:
    journal.run_begin("r")
    journal.approval_request(ApprovalRecord("r", "t1", "charge", payload={"amount": 5}))
    journal.approval_request(ApprovalRecord("r", "t1", "charge", payload={"amount": 9}))
    assert journal.approval_decide("r", "t1", ApprovalStatus.APPROVED, by="alice")
    assert not journal.approval_decide("r", "t1", ApprovalStatus.REJECTED, by="bob")
    (approval,) = journal.approvals("r")
    assert (approval.status, approval.decided_by, approval.payload) == (
        ApprovalStatus.APPROVED, "alice", {"amount": 5})


def test_it_finds_one_step_by_its_id(journal: Journal) -> None:
    journal.run_begin("r")
    journal.step_start("r", "t1", "charge", ("payment",))
    journal.step_finish("r", "t1", StepStatus.SUCCEEDED, update={"id": "ch_1"},
                        state_after={"id": "ch_1"})
    journal.step_start("r", "t2", "ship")

    step = find_step(journal, "r", "t1")
    assert step is not None
    assert (step.node, step.tags, step.status, step.update, step.state_after, step.done_seq) == (
        "charge", ("payment",), StepStatus.SUCCEEDED, {"id": "ch_1"}, {"id": "ch_1"}, 1)
    assert step == next(s for s in journal.steps("r") if s.step_id == "t1")
    running = find_step(journal, "r", "t2")
    assert running is not None and running.status == StepStatus.STARTED
    assert find_step(journal, "r", "t3") is None
    assert find_step(journal, "other", "t1") is None


def test_each_shipped_journal_reads_one_step_without_reading_the_run(journal: Journal) -> None:
    # A guarded tool call asks for its own step before it runs: reading every step of the run
    # (each with the whole state after it) made a run of n calls read O(n^2) of it.
    assert isinstance(journal, StepLookupJournal)
    journal.run_begin("r")
    journal.step_start("r", "t1", "charge")
    read: list[str] = []
    steps = journal.steps
    journal.steps = lambda run_id: read.append(run_id) or steps(run_id)  # type: ignore[method-assign]
    step = find_step(journal, "r", "t1")
    assert step is not None and step.step_id == "t1" and read == []


class _ThirdParty:
    """A journal written before ``step_get`` existed: it delegates to a shipped one, and
    only the methods of the ``Journal`` protocol."""

    def __init__(self, inner: Journal) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "step_get":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_it_finds_a_step_in_a_journal_without_step_get_by_reading_its_steps() -> None:
    journal = _ThirdParty(InMemoryJournal())
    journal.run_begin("r")  # type: ignore[attr-defined]
    journal.step_start("r", "t1", "charge")  # type: ignore[attr-defined]
    assert not isinstance(journal, StepLookupJournal)
    step = find_step(journal, "r", "t1")  # type: ignore[arg-type]
    assert step is not None and step.node == "charge"
    assert find_step(journal, "r", "t2") is None  # type: ignore[arg-type]


def test_it_gives_each_new_holder_of_a_lock_the_next_fencing_token(journal: Journal) -> None:
    def token() -> int:
        run = journal.run_get("r")
        assert run is not None
        return run.fencing_token

    assert journal.lock_acquire("r", "a", 0.05)
    first = token()
    assert journal.lock_acquire("r", "a", 0.05) and journal.lock_renew("r", "a", 0.05)
    assert token() == first  # extended and renewed by its holder: no new holder
    time.sleep(0.06)
    assert journal.lock_acquire("r", "b", 10)
    assert token() == first + 1  # taken over
    assert not journal.lock_acquire("r", "a", 10)
    assert token() == first + 1  # a refused take changes nothing
    journal.lock_release("r", "b")
    assert journal.lock_acquire("r", "b", 10)
    assert token() == first + 2  # let go of, then taken again (even by the same name)


def _waiting(journal: Journal, run_id: str, retry_at: float) -> None:
    """A compensating run let go of, its one compensation waiting for ``retry_at``."""
    assert journal.lock_acquire(run_id, "worker", 30)
    journal.step_start(run_id, "s", "charge")
    journal.step_finish(run_id, "s", StepStatus.SUCCEEDED)
    journal.run_set_status(run_id, RunStatus.COMPENSATING)
    journal.compensation_begin(CompensationRecord(run_id, "s", "charge", "key"))
    journal.compensation_attempt(run_id, "s", AttemptRecord(1, 1.0, 2.0, False),
                                 CompensationStatus.WAITING, retry_at=retry_at)
    journal.lock_release(run_id, "worker")


def test_it_lists_the_live_runs_no_process_drives_longest_abandoned_first(
        journal: Journal) -> None:
    assert isinstance(journal, AbandonedRunsJournal)
    _waiting(journal, "due", time.time() - 1)  # its next round has come
    _waiting(journal, "later", time.time() + 3600)  # waits: not abandoned, however idle
    assert journal.lock_acquire("let-go", "w", 30)  # live, its process let go (cancelled)
    journal.lock_release("let-go", "w")
    assert journal.lock_acquire("dead", "w", 0.05)  # its holder stopped renewing
    assert journal.lock_acquire("held", "w", 30)  # its holder renews it
    for settled in (RunStatus.SUCCEEDED, RunStatus.PAUSED):  # no process owes them anything
        assert journal.lock_acquire(str(settled), "w", 0.05)
        journal.run_set_status(str(settled), settled)
    time.sleep(0.06)

    def listed(idle: float, limit: int = 10) -> list[str]:
        return [r.run_id for r in journal.runs_abandoned(idle=idle, limit=limit)]

    assert listed(idle=30) == ["due", "dead"]  # let-go changed less than 30 s ago
    assert listed(idle=0) == ["due", "let-go", "dead"]
    assert listed(idle=0, limit=2) == ["due", "let-go"]
    (dead,) = [r for r in journal.runs_abandoned(idle=30, limit=10) if r.run_id == "dead"]
    assert (dead.status, dead.lock_owner) == (RunStatus.RUNNING, "w")
    assert journal.lock_acquire("dead", "sweeper", 30)  # taken over: driven again
    assert listed(idle=30) == ["due"]
