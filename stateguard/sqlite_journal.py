"""``SqliteJournal``: the journal in a SQLite file, shared by every process that opens it.

One connection per thread, WAL mode (readers never block the writer), and every rule of the
``Journal`` protocol held by a single SQL statement or an ``IMMEDIATE`` transaction, so two
processes racing for a lease or an approval cannot both win. States and updates are stored as
JSON: values JSON cannot hold are stored as their ``repr``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stateguard.effects import EffectRecord, settled_status
from stateguard.journal_rows import (
    dumps,
    effect_from,
    error_from,
    error_json,
    loads,
    run_from,
    step_from,
)
from stateguard.lifecycle import LIVE, check_change
from stateguard.records import (
    EFFECT_STATUSES,
    ApprovalRecord,
    ApprovalStatus,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    ErrorInfo,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sg_runs (
    run_id TEXT PRIMARY KEY, status TEXT NOT NULL, error TEXT,
    lock_owner TEXT, lock_expires REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, turn INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS sg_steps (
    run_id TEXT NOT NULL, step_id TEXT NOT NULL, node TEXT NOT NULL, tags TEXT NOT NULL,
    status TEXT NOT NULL, attempt INTEGER NOT NULL, started_at REAL NOT NULL,
    finished_at REAL, done_seq INTEGER, update_json TEXT, state_after TEXT, error TEXT,
    prev_status TEXT, turn INTEGER NOT NULL DEFAULT 1,
    kind TEXT NOT NULL DEFAULT 'compensatable', PRIMARY KEY (run_id, step_id));
CREATE TABLE IF NOT EXISTS sg_compensations (
    run_id TEXT NOT NULL, step_id TEXT NOT NULL, node TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, status TEXT NOT NULL, triggered_by TEXT NOT NULL,
    PRIMARY KEY (run_id, step_id));
CREATE TABLE IF NOT EXISTS sg_attempts (
    run_id TEXT NOT NULL, step_id TEXT NOT NULL, number INTEGER NOT NULL,
    started_at REAL NOT NULL, finished_at REAL NOT NULL, ok INTEGER NOT NULL,
    result TEXT NOT NULL, error TEXT, PRIMARY KEY (run_id, step_id, number));
CREATE TABLE IF NOT EXISTS sg_approvals (
    run_id TEXT NOT NULL, step_id TEXT NOT NULL, node TEXT NOT NULL, payload TEXT,
    status TEXT NOT NULL, decided_by TEXT, reason TEXT NOT NULL DEFAULT '',
    requested_at REAL NOT NULL, decided_at REAL, PRIMARY KEY (run_id, step_id));
CREATE TABLE IF NOT EXISTS sg_effects (
    provider TEXT NOT NULL, external_id TEXT NOT NULL, run_id TEXT NOT NULL,
    step_id TEXT NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL, amount INTEGER,
    currency TEXT NOT NULL, idempotency_key TEXT NOT NULL, undoes TEXT NOT NULL,
    status TEXT NOT NULL, recorded_at REAL NOT NULL, PRIMARY KEY (provider, external_id));
CREATE INDEX IF NOT EXISTS sg_effects_run ON sg_effects (run_id);
CREATE INDEX IF NOT EXISTS sg_effects_undoes ON sg_effects (provider, undoes);
"""
# Columns added since the first release, added to a file made before them.
_ADDED_COLUMNS = (("sg_runs", "turn", "INTEGER NOT NULL DEFAULT 1"),
                  ("sg_steps", "turn", "INTEGER NOT NULL DEFAULT 1"),
                  ("sg_compensations", "retry_at", "REAL"),
                  ("sg_steps", "kind", "TEXT NOT NULL DEFAULT 'compensatable'"),
                  ("sg_runs", "fencing_token", "INTEGER NOT NULL DEFAULT 0"))
_LIVE = ", ".join(f"'{status.value}'" for status in sorted(LIVE))
# The runs no process drives (journal.AbandonedRunsJournal), with since when: their lock
# expired; or no one holds them and they have not changed for a while, unless their
# compensations wait for a round that has not come.
_ABANDONED = """
SELECT {columns} FROM (
    SELECT r.*, CASE
        WHEN r.lock_owner IS NOT NULL THEN CASE WHEN r.lock_expires < :now
                                                THEN r.lock_expires END
        WHEN w.first_due IS NOT NULL THEN CASE WHEN w.first_due <= :now THEN w.first_due END
        WHEN r.updated_at < :now - :idle THEN r.updated_at END AS since
    FROM sg_runs r LEFT JOIN (SELECT run_id, MIN(retry_at) AS first_due FROM sg_compensations
                              WHERE status = 'waiting' GROUP BY run_id) w USING (run_id)
    WHERE r.status IN ({live}))
WHERE since IS NOT NULL ORDER BY since LIMIT :limit"""
_EFFECT_COLUMNS = ("run_id, step_id, node, provider, kind, external_id, amount, currency, "
                   "idempotency_key, undoes, status, recorded_at")


_RUN_COLUMNS = ("run_id, status, error, lock_owner, lock_expires, created_at, updated_at, turn,"
                " fencing_token")


_STEP_COLUMNS = ("step_id, node, tags, status, attempt, started_at, finished_at, done_seq,"
                 " update_json, state_after, error, turn, kind")


class SqliteJournal:
    """A ``Journal`` in a SQLite file, so a second process can see and act on what the first did.

    Example: ``StateGuardCheckpointer(SqliteSaver(conn), journal=SqliteJournal("runs.db"))``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        db = self._db()
        db.executescript(_SCHEMA)
        with self._tx():
            for table, column, kind in _ADDED_COLUMNS:
                if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL survives a killed process (what recovery is about); only power loss can
            # drop the last transactions.
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- runs -------------------------------------------------------------------------------
    def run_begin(self, run_id: str) -> RunRecord:
        now = time.time()
        self._db().execute(
            "INSERT OR IGNORE INTO sg_runs (run_id, status, created_at, updated_at)"
            " VALUES (?, ?, ?, ?)", (run_id, RunStatus.RUNNING.value, now, now))
        run = self.run_get(run_id)
        assert run is not None
        return run

    def run_get(self, run_id: str) -> RunRecord | None:
        row = self._db().execute(
            f"SELECT {_RUN_COLUMNS} FROM sg_runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else run_from(row)

    def run_set_status(self, run_id: str, status: RunStatus,
                       error: ErrorInfo | None = None) -> None:
        now = time.time()
        keep_error = error is None and status not in (RunStatus.RUNNING, RunStatus.SUCCEEDED)
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO sg_runs (run_id, status, created_at, updated_at)"
                       " VALUES (?, ?, ?, ?)", (run_id, status.value, now, now))
            (old,) = db.execute("SELECT status FROM sg_runs WHERE run_id = ?",
                                (run_id,)).fetchone()
            check_change(old, status, run=run_id)
            db.execute("UPDATE sg_runs SET status = ?, updated_at = ?,"
                       " error = CASE WHEN ? THEN error ELSE ? END WHERE run_id = ?",
                       (status.value, now, keep_error, error_json(error),
                        run_id))

    def run_next_turn(self, run_id: str) -> RunRecord:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO sg_runs (run_id, status, created_at, updated_at)"
                       " VALUES (?, ?, ?, ?)", (run_id, RunStatus.RUNNING.value, now, now))
            (old,) = db.execute("SELECT status FROM sg_runs WHERE run_id = ?",
                                (run_id,)).fetchone()
            check_change(old, RunStatus.RUNNING, run=run_id)
            db.execute("UPDATE sg_runs SET turn = turn + 1, status = ?, error = NULL,"
                       " updated_at = ? WHERE run_id = ?", (RunStatus.RUNNING.value, now, run_id))
        run = self.run_get(run_id)
        assert run is not None
        return run

    def run_purge(self, run_id: str) -> None:
        with self._tx() as db:
            for table in ("sg_attempts", "sg_compensations", "sg_approvals", "sg_steps",
                          "sg_effects", "sg_runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

    def lock_acquire(self, run_id: str, owner: str, ttl: float) -> bool:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO sg_runs (run_id, status, created_at, updated_at)"
                       " VALUES (?, ?, ?, ?)", (run_id, RunStatus.RUNNING.value, now, now))
            cursor = db.execute(
                "UPDATE sg_runs SET lock_owner = ?, lock_expires = ?, fencing_token ="
                " fencing_token + (lock_owner IS NOT ?) WHERE run_id = ?"
                " AND (lock_owner IS NULL OR lock_owner = ? OR lock_expires < ?)",
                (owner, now + ttl, owner, run_id, owner, now))
            return cursor.rowcount == 1

    def lock_renew(self, run_id: str, owner: str, ttl: float) -> bool:
        cursor = self._db().execute("UPDATE sg_runs SET lock_expires = ? WHERE run_id = ? AND"
                                    " lock_owner = ?", (time.time() + ttl, run_id, owner))
        return cursor.rowcount == 1

    def lock_release(self, run_id: str, owner: str) -> None:
        # A live run let go of is abandoned once it stays unchanged (runs_abandoned).
        self._db().execute("UPDATE sg_runs SET lock_owner = NULL, lock_expires = 0,"
                           " updated_at = ? WHERE run_id = ? AND lock_owner = ?",
                           (time.time(), run_id, owner))

    def runs_abandoned(self, *, idle: float, limit: int) -> list[RunRecord]:
        now = time.time()
        rows = self._db().execute(_ABANDONED.format(columns=_RUN_COLUMNS, live=_LIVE),
                                  {"now": now, "idle": idle, "limit": limit}).fetchall()
        return [run_from(r) for r in rows]

    # -- steps ------------------------------------------------------------------------------
    def step_start(self, run_id: str, step_id: str, node: str,
                   tags: tuple[str, ...] = (), *, kind: str = "compensatable"
                   ) -> tuple[StepRecord, StepStatus | None]:
        step = StepRecord(run_id, step_id, node, tuple(tags), kind=str(kind))
        # One statement: SET expressions see the old row, so prev_status keeps the status the
        # step had before this start (STARTED means a previous run of it never finished).
        # The step belongs to the run's current turn (a step started again keeps its turn).
        row = self._db().execute(
            "INSERT INTO sg_steps (run_id, step_id, node, tags, status, attempt, started_at,"
            " turn, kind) VALUES (?, ?, ?, ?, ?, 1, ?, COALESCE((SELECT turn FROM sg_runs"
            " WHERE run_id = ?), 1), ?) ON CONFLICT (run_id, step_id) DO UPDATE SET"
            " prev_status = status, status = excluded.status, attempt = attempt + 1,"
            " started_at = excluded.started_at, finished_at = NULL, done_seq = NULL,"
            " update_json = NULL, state_after = NULL, error = NULL, kind = excluded.kind"
            " RETURNING attempt, prev_status, turn",
            (run_id, step_id, node, json.dumps(list(tags)), step.status.value,
             step.started_at, run_id, step.kind)).fetchone()
        step.attempt, step.turn = row[0], row[2]
        return step, StepStatus(row[1]) if row[1] else None

    def step_finish(self, run_id: str, step_id: str, status: StepStatus, *, update: Any = None,
                    state_after: Any = None, error: ErrorInfo | None = None) -> None:
        with_effect = status in EFFECT_STATUSES
        self._db().execute(
            "UPDATE sg_steps SET status = ?, finished_at = ?, update_json = ?, state_after = ?,"
            " error = ?, done_seq = CASE WHEN ? THEN (SELECT COALESCE(MAX(done_seq), 0) + 1"
            " FROM sg_steps WHERE run_id = ?) END WHERE run_id = ? AND step_id = ?",
            (status.value, time.time(), dumps(update), dumps(state_after),
             error_json(error), with_effect, run_id, run_id, step_id))

    def steps(self, run_id: str) -> list[StepRecord]:
        rows = self._db().execute(
            f"SELECT {_STEP_COLUMNS} FROM sg_steps WHERE run_id = ? ORDER BY started_at",
            (run_id,)).fetchall()
        return [step_from(run_id, r) for r in rows]

    def step_get(self, run_id: str, step_id: str) -> StepRecord | None:
        # The primary key (run_id, step_id): one row, whatever the run's length.
        row = self._db().execute(
            f"SELECT {_STEP_COLUMNS} FROM sg_steps WHERE run_id = ? AND step_id = ?",
            (run_id, step_id)).fetchone()
        return step_from(run_id, row) if row is not None else None

    # -- compensations ----------------------------------------------------------------------
    def compensation_begin(self, record: CompensationRecord) -> CompensationRecord:
        self._db().execute(
            "INSERT OR IGNORE INTO sg_compensations (run_id, step_id, node, idempotency_key,"
            " status, triggered_by) VALUES (?, ?, ?, ?, ?, ?)",
            (record.run_id, record.step_id, record.node, record.idempotency_key,
             record.status.value, record.triggered_by))
        return next(c for c in self.compensations(record.run_id) if c.step_id == record.step_id)

    def compensation_attempt(self, run_id: str, step_id: str, attempt: AttemptRecord,
                             status: CompensationStatus, *, retry_at: float | None = None
                             ) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO sg_attempts (run_id, step_id, number, started_at,"
                       " finished_at, ok, result, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (run_id, step_id, attempt.number, attempt.started_at,
                        attempt.finished_at, attempt.ok, attempt.result,
                        error_json(attempt.error)))
            db.execute("UPDATE sg_compensations SET status = ?, retry_at = ? WHERE run_id = ?"
                       " AND step_id = ?", (status.value, retry_at, run_id, step_id))

    def compensations(self, run_id: str) -> list[CompensationRecord]:
        db = self._db()
        attempts: dict[str, list[AttemptRecord]] = {}
        for r in db.execute("SELECT step_id, number, started_at, finished_at, ok, result, error"
                            " FROM sg_attempts WHERE run_id = ? ORDER BY step_id, number",
                            (run_id,)):
            attempts.setdefault(r[0], []).append(
                AttemptRecord(r[1], r[2], r[3], bool(r[4]), r[5], error_from(r[6])))
        rows = db.execute("SELECT step_id, node, idempotency_key, status, triggered_by,"
                          " retry_at FROM sg_compensations WHERE run_id = ?",
                          (run_id,)).fetchall()
        return [CompensationRecord(run_id, r[0], r[1], r[2], CompensationStatus(r[3]), r[4],
                                   attempts.get(r[0], []), r[5]) for r in rows]

    # -- approvals --------------------------------------------------------------------------
    def approval_request(self, record: ApprovalRecord) -> ApprovalRecord:
        self._db().execute(
            "INSERT OR IGNORE INTO sg_approvals (run_id, step_id, node, payload, status,"
            " requested_at) VALUES (?, ?, ?, ?, ?, ?)",
            (record.run_id, record.step_id, record.node, dumps(record.payload),
             record.status.value, record.requested_at))
        return next(a for a in self.approvals(record.run_id) if a.step_id == record.step_id)

    def approval_decide(self, run_id: str, step_id: str, status: ApprovalStatus, *,
                        by: str | None, reason: str = "") -> bool:
        cursor = self._db().execute(
            "UPDATE sg_approvals SET status = ?, decided_by = ?, reason = ?, decided_at = ?"
            " WHERE run_id = ? AND step_id = ? AND status = ?",
            (status.value, by, reason, time.time(), run_id, step_id,
             ApprovalStatus.PENDING.value))
        return cursor.rowcount == 1

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        rows = self._db().execute(
            "SELECT step_id, node, payload, status, decided_by, reason, requested_at, decided_at"
            " FROM sg_approvals WHERE run_id = ? ORDER BY requested_at", (run_id,)).fetchall()
        return [ApprovalRecord(run_id, r[0], r[1], loads(r[2]), ApprovalStatus(r[3]), r[4],
                               r[5], r[6], r[7]) for r in rows]

    # -- effects ----------------------------------------------------------------------------
    def effect_record(self, record: EffectRecord) -> EffectRecord:
        e = record.effect
        with self._tx() as db:
            db.execute(f"INSERT OR IGNORE INTO sg_effects ({_EFFECT_COLUMNS}) VALUES "
                       "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (record.run_id, record.step_id, record.node, e.provider, e.kind,
                        e.external_id, e.amount, e.currency, e.idempotency_key, e.undoes,
                        record.status.value, record.recorded_at))
            stored = effect_from(db.execute(
                f"SELECT {_EFFECT_COLUMNS} FROM sg_effects WHERE provider = ? AND external_id = ?",
                record.key).fetchone())
            # Settle what it undoes, and itself (effects undoing it may have come first).
            for external_id in filter(None, (stored.effect.undoes, stored.effect.external_id)):
                self._settle(db, e.provider, external_id)
            return effect_from(db.execute(
                f"SELECT {_EFFECT_COLUMNS} FROM sg_effects WHERE provider = ? AND external_id = ?",
                record.key).fetchone())

    @staticmethod
    def _settle(db: sqlite3.Connection, provider: str, external_id: str) -> None:
        row = db.execute(f"SELECT {_EFFECT_COLUMNS} FROM sg_effects WHERE provider = ? AND "
                         "external_id = ?", (provider, external_id)).fetchone()
        if row is None:
            return
        undoing = [effect_from(r).effect for r in db.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM sg_effects WHERE provider = ? AND undoes = ?",
            (provider, external_id))]
        status = settled_status(effect_from(row).effect, undoing)
        db.execute("UPDATE sg_effects SET status = ? WHERE provider = ? AND external_id = ?",
                   (status.value, provider, external_id))

    def effects(self, run_id: str) -> list[EffectRecord]:
        rows = self._db().execute(f"SELECT {_EFFECT_COLUMNS} FROM sg_effects WHERE run_id = ? "
                                  "ORDER BY recorded_at", (run_id,)).fetchall()
        return [effect_from(r) for r in rows]
