"""What ``PostgresJournal`` promises beyond the journal contract (test_journal_contract.py
runs that on it too): one clock for leases, fencing, completion numbers under concurrency,
an idempotent setup, thread safety, and a core that needs psycopg only for it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import time_machine
from psycopg.rows import dict_row

from stateguard import ConfigurationError, LeaseLost
from stateguard.effects import Effect, EffectRecord
from stateguard.postgres_journal import PostgresJournal
from stateguard.postgres_schema import MIGRATIONS
from stateguard.records import (
    ApprovalRecord,
    ApprovalStatus,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    RunStatus,
    StepStatus,
)


def another(pg_journal: PostgresJournal, pg_journal_db: str) -> PostgresJournal:
    """The same journal as another process (on another host) opens it."""
    return PostgresJournal(pg_journal_db, schema=pg_journal.schema, max_connections=2)


def test_a_host_whose_clock_runs_ahead_never_takes_a_run_over_early(
        pg_journal: PostgresJournal, pg_journal_db: str) -> None:
    assert pg_journal.lock_acquire("r", "worker", 30)
    with another(pg_journal, pg_journal_db) as ahead, \
            time_machine.travel(time.time() + 3600, tick=True):
        # By this host's clock the worker's lease ran out an hour ago; by the database's, not.
        assert not ahead.lock_acquire("r", "thief", 30)
        assert ahead.runs_abandoned(idle=0, limit=10) == []
        assert ahead.lock_acquire("s", "ahead", 30)
    run = pg_journal.run_get("s")
    assert run is not None and abs(run.lock_expires - (time.time() + 30)) < 5  # not +1 h


def test_a_host_whose_clock_runs_behind_is_never_taken_over_falsely(
        pg_journal: PostgresJournal, pg_journal_db: str) -> None:
    with another(pg_journal, pg_journal_db) as behind:
        with time_machine.travel(time.time() - 3600, tick=True):
            assert behind.lock_acquire("r", "behind", 0.3)  # 0.3 s, by the database's clock
        assert not pg_journal.lock_acquire("r", "other", 30)  # not expired an hour ago
        time.sleep(0.35)
        assert pg_journal.lock_acquire("r", "other", 30)  # and expired when it should


def test_a_worker_that_lost_its_lease_cannot_write_over_the_recovery(
        pg_journal: PostgresJournal, pg_journal_db: str) -> None:
    stalled = pg_journal  # a worker that froze past its lease, then woke up
    assert stalled.lock_acquire("r", "stalled", 0.05)
    stalled.step_start("r", "s1", "charge")
    stalled.step_finish("r", "s1", StepStatus.SUCCEEDED, update={"id": "pi_1"})
    stalled.compensation_begin(CompensationRecord("r", "s1", "charge", "key"))
    stalled.approval_request(ApprovalRecord("r", "s2", "ship"))
    time.sleep(0.06)
    with another(pg_journal, pg_journal_db) as sweeper:
        assert sweeper.lock_acquire("r", "sweeper", 30)
        assert sweeper.fencing_token("r") == (stalled.fencing_token("r") or 0) + 1
        late_writes: list[Callable[[], Any]] = [
            lambda: stalled.step_start("r", "s3", "email"),
            lambda: stalled.step_finish("r", "s1", StepStatus.FAILED),
            lambda: stalled.run_set_status("r", RunStatus.SUCCEEDED),
            lambda: stalled.run_next_turn("r"),
            lambda: stalled.compensation_begin(CompensationRecord("r", "s9", "x", "k")),
            lambda: stalled.compensation_attempt("r", "s1", AttemptRecord(1, 1.0, 2.0, True),
                                                 CompensationStatus.SUCCEEDED),
            lambda: stalled.approval_request(ApprovalRecord("r", "s4", "gate")),
            lambda: stalled.approval_decide("r", "s2", ApprovalStatus.APPROVED, by="x"),
        ]
        for write in late_writes:
            with pytest.raises(LeaseLost):
                write()
        assert not stalled.lock_renew("r", "stalled", 30)

        # The run is as the sweeper took it over, and its own writes go through.
        assert [(s.step_id, s.status, s.done_seq) for s in sweeper.steps("r")] == [
            ("s1", StepStatus.SUCCEEDED, 1)]
        assert [(c.step_id, c.attempts) for c in sweeper.compensations("r")] == [("s1", [])]
        assert [a.status for a in sweeper.approvals("r")] == [ApprovalStatus.PENDING]
        run = sweeper.run_get("r")
        assert run is not None and (run.status, run.turn) == (RunStatus.RUNNING, 1)
        sweeper.run_set_status("r", RunStatus.COMPENSATING)
        # An effect happened whoever found it: recorded, not fenced.
        stalled.effect_record(EffectRecord("r", "s1", "charge",
                                           Effect("stripe", "charge", "pi_1", amount=5)))
        assert [e.effect.external_id for e in sweeper.effects("r")] == ["pi_1"]
        stalled.lock_release("r", "stalled")  # not its lock any more: nothing happens
        run = sweeper.run_get("r")
        assert run is not None and run.lock_owner == "sweeper"


def test_steps_finishing_at_once_get_distinct_completion_numbers(
        pg_journal: PostgresJournal, pg_journal_db: str) -> None:
    # Parallel branches finish at once, from several connections: a MAX()+1 over the steps
    # would hand two of them the same number, and the unwind order would be a guess.
    pg_journal.run_begin("r")
    for i in range(40):
        pg_journal.step_start("r", f"s{i}", "node")
    journals = [another(pg_journal, pg_journal_db) for _ in range(8)]
    start = threading.Barrier(len(journals))
    errors: list[BaseException] = []

    def finish(journal: PostgresJournal, steps: range) -> None:
        try:
            start.wait(10)
            for i in steps:
                journal.step_finish("r", f"s{i}", StepStatus.SUCCEEDED)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(j, range(n, 40, len(journals))))
               for n, j in enumerate(journals)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for journal in journals:
        journal.close()
    assert errors == []
    assert sorted(s.done_seq or 0 for s in pg_journal.steps("r")) == list(range(1, 41))


def test_setup_is_idempotent_and_safe_from_several_processes_at_once(
        pg_journal_db: str, pg_schema: str) -> None:
    journals = [PostgresJournal(pg_journal_db, schema=pg_schema, max_connections=1)
                for _ in range(4)]
    start = threading.Barrier(len(journals))
    errors: list[BaseException] = []

    def setup(journal: PostgresJournal) -> None:
        try:
            start.wait(10)
            journal.setup()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=setup, args=(j,)) for j in journals]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    journals[0].setup()  # and again, later
    assert errors == []
    with psycopg.connect(pg_journal_db) as conn:
        applied = [v for (v,) in conn.execute(f'SELECT v FROM "{pg_schema}".migrations')]
    assert applied == list(range(len(MIGRATIONS)))
    journals[0].run_begin("r")
    for journal in journals:
        journal.close()


def test_the_tables_check_every_status_the_core_has(pg_journal: PostgresJournal,
                                                     pg_journal_db: str) -> None:
    # A status added to an enum without a migration that allows it fails here, not in
    # production at the first run that reaches it.
    with psycopg.connect(pg_journal_db) as conn:
        checks = dict(conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE connamespace = %s::regnamespace AND contype = 'c'",
            (pg_journal.schema,)).fetchall())
    enums = {"runs_status_valid": RunStatus, "steps_status_valid": StepStatus,
             "compensations_status_valid": CompensationStatus,
             "approvals_status_valid": ApprovalStatus}
    for name, enum in enums.items():
        allowed = re.findall(r"'([a-z_]+)'::text", checks[name])
        assert sorted(allowed) == sorted(value.value for value in enum), name


def test_one_connection_serves_many_threads(pg_journal_db: str, pg_schema: str) -> None:
    # dict_row: the connection as LangGraph's PostgresSaver wants its own; the journal reads
    # tuples whatever the connection's row factory.
    with psycopg.connect(pg_journal_db, autocommit=True, row_factory=dict_row) as conn:
        journal = PostgresJournal(conn, schema=pg_schema)
        journal.setup()
        errors: list[BaseException] = []

        def run(run_id: str) -> None:
            try:
                assert journal.lock_acquire(run_id, run_id, 30)
                for i in range(10):
                    journal.step_start(run_id, f"s{i}", "node")
                    journal.step_finish(run_id, f"s{i}", StepStatus.SUCCEEDED)
                journal.run_set_status(run_id, RunStatus.SUCCEEDED)
                journal.lock_release(run_id, run_id)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(f"r{n}",)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        for n in range(8):
            assert [s.done_seq for s in journal.steps(f"r{n}")] == list(range(1, 11))
            run = journal.run_get(f"r{n}")
            assert run is not None and (run.status, run.lock_owner) == (RunStatus.SUCCEEDED,
                                                                        None)


def test_it_refuses_what_it_cannot_use(pg_journal_db: str, pg_schema: str) -> None:
    for schema in ("Runs", "1st", 'x"; DROP TABLE runs; --', "x" * 64, ""):
        with pytest.raises(ConfigurationError, match="schema must be a lower-case"):
            PostgresJournal(pg_journal_db, schema=schema)
    with pytest.raises(ConfigurationError, match="max_connections"):
        PostgresJournal(pg_journal_db, max_connections=0)
    with pytest.raises(ConfigurationError, match="not a PostgreSQL connection string"):
        PostgresJournal("host=localhost port")
    with pytest.raises(ConfigurationError, match="takes a conninfo string"):
        PostgresJournal(42)  # type: ignore[arg-type]
    with PostgresJournal(pg_journal_db, schema=pg_schema) as journal, \
            pytest.raises(ConfigurationError, match=r"call PostgresJournal.setup\(\) once"):
        journal.run_get("r")
    with psycopg.connect(pg_journal_db) as conn, \
            pytest.raises(ConfigurationError, match="needs autocommit connections"):
        PostgresJournal(conn, schema=pg_schema).run_get("r")


def test_the_core_needs_psycopg_only_for_the_postgres_journal() -> None:
    code = ("import sys, stateguard; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in {'psycopg', 'psycopg_pool'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
    # Without the extra: a message that says what to install, not psycopg's ImportError.
    code = ("import sys; sys.modules['psycopg'] = None; import stateguard\n"
            "try:\n    import stateguard.postgres_journal\n"
            "except ImportError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "pip install 'stateguard[postgres]'" in out.stdout
