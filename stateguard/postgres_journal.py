"""``PostgresJournal``: the journal in PostgreSQL, for runs that many processes on many hosts
share. Needs the ``postgres`` extra (psycopg 3 and its pool): ``pip install
'stateguard[postgres]'``.

Rules it keeps beyond the ``Journal`` protocol's:

- **One clock.** A lease is judged by the database's clock (``clock_timestamp()``), never a
  caller's: ``lock_acquire`` asks the database whether the holder's lease ran out and sets the
  new expiry from its own time, so a host whose clock runs ahead never takes a run over early,
  and one whose clock runs behind is never taken over falsely. A run's and a step's times are
  the database's too (steps are ordered by them, whichever host ran them).
- **Fencing.** Every new holder of a run's lock gets the next fencing token
  (``RunRecord.fencing_token``); the journal remembers the token it took, and every later
  write for that run (steps, status, compensations, approvals) is refused, in the same
  statement, unless the token is still the run's: a worker that stalled past its lease and
  wakes after a sweeper took the run over gets ``LeaseLost`` instead of writing over the
  recovery. Effects are not fenced: an effect happened whoever records it. (The fence is per
  journal object: two guards of one process sharing it share its tokens; the guard's own
  heartbeat catches a lease lost in-process.)
- **One statement per write** in autocommit (a step costs two round trips, as on SQLite);
  the few that need more (an effect and what it settles, a purge) are one transaction.

Connections: a conninfo string (the journal opens a ``psycopg_pool.ConnectionPool`` of its own,
closed by ``close()``), a ``ConnectionPool`` (its connections must be autocommit, as LangGraph's
``PostgresSaver`` needs too), or one autocommit ``psycopg.Connection``, used under a lock (do
not share that one with a saver: give each its own connection, or a pool). Thread-safe.
The tables are created by ``setup()`` (``stateguard.postgres_schema``), once per database and
schema, idempotent.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
    from psycopg.rows import tuple_row
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # the extra is not installed
    raise ImportError("PostgresJournal needs psycopg 3 and psycopg-pool: "
                      "pip install 'stateguard[postgres]'") from exc

from stateguard.effects import EffectRecord, settled_status
from stateguard.exceptions import ConfigurationError, LeaseLost
from stateguard.journal_rows import (
    dumps,
    effect_from,
    error_from,
    error_json,
    loads,
    run_from,
    step_from,
)
from stateguard.lifecycle import CHANGES, LIVE, check_change
from stateguard.postgres_schema import apply_migrations
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

Cursor = psycopg.Cursor[tuple[Any, ...]]

# Lower case: what PostgreSQL folds an unquoted name to, so that psql users find it as written.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _epoch(column: str) -> str:
    return f"extract(epoch FROM {column})::float8"


_RUN_COLUMNS = ", ".join([
    "run_id", "status", "error::text", "lock_owner", _epoch("lock_expires"),
    _epoch("created_at"), _epoch("updated_at"), "turn", "fencing_token"])
_STEP_COLUMNS = ", ".join([
    "step_id", "node", "tags", "status", "attempt", _epoch("started_at"), _epoch("finished_at"),
    "done_seq", "update_json::text", "state_after::text", "error::text", "turn", "kind"])
_EFFECT_COLUMNS = ", ".join([
    "run_id", "step_id", "node", "provider", "kind", "external_id", "amount", "currency",
    "idempotency_key", "undoes", "status", _epoch("recorded_at")])
# The write goes through only if the writer holds no lease (token NULL) or its token is still
# the run's. FOR SHARE: a takeover committing meanwhile makes the check wait for it and then see
# the new token, instead of passing on the snapshot taken before; and a takeover waits for a
# write that passed the check to commit, so every fenced write lands while its lease held.
_FENCE = ("(%(token)s::bigint IS NULL OR EXISTS (SELECT 1 FROM {s}.runs f WHERE f.run_id ="
          " %(run)s AND f.fencing_token = %(token)s FOR SHARE))")
_OURS = "(%(token)s::bigint IS NULL OR fencing_token = %(token)s)"

_SQL = {
    "run_insert": "INSERT INTO {s}.runs (run_id, status, error) VALUES (%(run)s, %(status)s,"
                  " %(error)s::json) ON CONFLICT (run_id) DO NOTHING",
    "run_get": f"SELECT {_RUN_COLUMNS} FROM {{s}}.runs WHERE run_id = %(run)s",
    "run_fence": "SELECT status, fencing_token FROM {s}.runs WHERE run_id = %(run)s",
    # Only from a status the state machine allows to go to the new one: checked by the same
    # statement, so no read comes before the write.
    "run_set_status": "UPDATE {s}.runs SET status = %(status)s, updated_at = clock_timestamp(),"
                      " error = CASE WHEN %(set_error)s THEN %(error)s::json ELSE error END"
                      f" WHERE run_id = %(run)s AND status = ANY(%(sources)s::text[]) AND {_OURS}",
    "run_next_turn": "UPDATE {s}.runs SET turn = turn + 1, status = 'running', error = NULL,"
                     " updated_at = clock_timestamp() WHERE run_id = %(run)s"
                     f" AND status = ANY(%(sources)s::text[]) AND {_OURS} RETURNING {_RUN_COLUMNS}",
    # Take the lock (creating the run), or extend it for its holder; a new holder gets the
    # next fencing token. Expired means expired by the database's clock.
    "lock_acquire": """
INSERT INTO {s}.runs AS r (run_id, status, lock_owner, lock_expires, fencing_token)
VALUES (%(run)s, 'running', %(owner)s, clock_timestamp() + make_interval(secs => %(ttl)s), 1)
ON CONFLICT (run_id) DO UPDATE SET
    lock_owner = excluded.lock_owner, lock_expires = excluded.lock_expires,
    fencing_token = r.fencing_token
        + CASE WHEN r.lock_owner IS NOT DISTINCT FROM excluded.lock_owner THEN 0 ELSE 1 END
WHERE r.lock_owner IS NULL OR r.lock_owner = excluded.lock_owner
    OR r.lock_expires < clock_timestamp()
RETURNING r.fencing_token""",
    "lock_renew": "UPDATE {s}.runs SET lock_expires = clock_timestamp()"
                  " + make_interval(secs => %(ttl)s) WHERE run_id = %(run)s"
                  " AND lock_owner = %(owner)s",
    # A live run let go of is abandoned once it stays unchanged (runs_abandoned).
    "lock_release": "UPDATE {s}.runs SET lock_owner = NULL, lock_expires = NULL,"
                    " updated_at = clock_timestamp() WHERE run_id = %(run)s"
                    " AND lock_owner = %(owner)s",
    # Insert the step, or start it again: prev_status keeps the status it had before (SET
    # sees the old row). It belongs to the run's current turn; a step started again keeps its.
    "step_start": f"""
INSERT INTO {{s}}.steps AS st (run_id, step_id, node, tags, status, attempt, kind, turn,
                               started_at)
SELECT %(run)s, %(step)s, %(node)s, %(tags)s::text[], 'started', 1, %(kind)s,
    COALESCE((SELECT turn FROM {{s}}.runs WHERE run_id = %(run)s), 1), clock_timestamp()
WHERE {_FENCE}
ON CONFLICT (run_id, step_id) DO UPDATE SET
    prev_status = st.status, status = 'started', attempt = st.attempt + 1,
    started_at = excluded.started_at, finished_at = NULL, done_seq = NULL, update_json = NULL,
    state_after = NULL, error = NULL, kind = excluded.kind
RETURNING attempt, prev_status, turn, {_epoch("started_at")}""",
    # A step with an effect gets the run's next completion number. The counter is a column of
    # the run's row, bumped by an UPDATE: two steps finishing at once wait for each other on
    # that row (a MAX() over the steps would give both the same number), and the UPDATE is the
    # fence too.
    "step_finish": f"""
WITH run AS (
    UPDATE {{s}}.runs SET done_seq = done_seq + %(effect)s
    WHERE run_id = %(run)s AND {_OURS} RETURNING done_seq)
UPDATE {{s}}.steps SET status = %(status)s, finished_at = clock_timestamp(),
    update_json = %(update)s::json, state_after = %(state)s::json, error = %(error)s::json,
    done_seq = CASE WHEN %(effect)s = 1 THEN (SELECT done_seq FROM run) END
WHERE run_id = %(run)s AND step_id = %(step)s AND EXISTS (SELECT 1 FROM run)""",
    "steps": f"SELECT {_STEP_COLUMNS} FROM {{s}}.steps WHERE run_id = %(run)s"
             " ORDER BY started_at, step_id",
    "step_get": f"SELECT {_STEP_COLUMNS} FROM {{s}}.steps WHERE run_id = %(run)s"
                " AND step_id = %(step)s",
    "compensation_begin": f"""
INSERT INTO {{s}}.compensations (run_id, step_id, node, idempotency_key, status, triggered_by)
SELECT %(run)s, %(step)s, %(node)s, %(key)s, %(status)s, %(by)s WHERE {_FENCE}
ON CONFLICT (run_id, step_id) DO NOTHING""",
    "compensation_attempt": f"""
WITH comp AS (
    UPDATE {{s}}.compensations SET status = %(status)s,
        retry_at = to_timestamp(%(retry_at)s::float8)
    WHERE run_id = %(run)s AND step_id = %(step)s AND {_FENCE} RETURNING run_id)
INSERT INTO {{s}}.attempts (run_id, step_id, number, started_at, finished_at, ok, result, error)
SELECT %(run)s, %(step)s, %(number)s, to_timestamp(%(started)s::float8),
    to_timestamp(%(finished)s::float8), %(ok)s, %(result)s, %(error)s::json FROM comp""",
    "compensations": "SELECT step_id, node, idempotency_key, status, triggered_by,"
                     f" {_epoch('retry_at')} FROM {{s}}.compensations WHERE run_id = %(run)s"
                     " ORDER BY begun_at, step_id",
    "attempts": f"SELECT step_id, number, {_epoch('started_at')}, {_epoch('finished_at')}, ok,"
                " result, error::text FROM {s}.attempts WHERE run_id = %(run)s"
                " ORDER BY step_id, number",
    "approval_request": f"""
INSERT INTO {{s}}.approvals (run_id, step_id, node, payload, status, requested_at)
SELECT %(run)s, %(step)s, %(node)s, %(payload)s::json, %(status)s,
    to_timestamp(%(at)s::float8) WHERE {_FENCE}
ON CONFLICT (run_id, step_id) DO NOTHING""",
    "approval_decide": "UPDATE {s}.approvals SET status = %(status)s, decided_by = %(by)s,"
                       " reason = %(reason)s, decided_at = clock_timestamp()"
                       " WHERE run_id = %(run)s AND step_id = %(step)s AND status = 'pending'"
                       f" AND {_FENCE}",
    "approvals": f"SELECT step_id, node, payload::text, status, decided_by, reason,"
                 f" {_epoch('requested_at')}, {_epoch('decided_at')} FROM {{s}}.approvals"
                 " WHERE run_id = %(run)s ORDER BY requested_at, step_id",
    "effect_insert": f"""
INSERT INTO {{s}}.effects ({_EFFECT_COLUMNS.replace(_epoch("recorded_at"), "recorded_at")})
VALUES (%(run)s, %(step)s, %(node)s, %(provider)s, %(kind)s, %(external_id)s, %(amount)s,
    %(currency)s, %(key)s, %(undoes)s, %(status)s, to_timestamp(%(at)s::float8))
ON CONFLICT (provider, external_id) DO NOTHING""",
    "effect_get": f"SELECT {_EFFECT_COLUMNS} FROM {{s}}.effects WHERE provider = %(provider)s"
                  " AND external_id = %(external_id)s",
    # Under the effect's row lock: two refunds of one charge recorded at once both count.
    "effect_lock": f"SELECT {_EFFECT_COLUMNS} FROM {{s}}.effects WHERE provider = %(provider)s"
                   " AND external_id = %(external_id)s FOR UPDATE",
    "effects_undoing": f"SELECT {_EFFECT_COLUMNS} FROM {{s}}.effects"
                       " WHERE provider = %(provider)s AND undoes = %(external_id)s",
    "effect_settle": "UPDATE {s}.effects SET status = %(status)s WHERE provider = %(provider)s"
                     " AND external_id = %(external_id)s",
    "effects": f"SELECT {_EFFECT_COLUMNS} FROM {{s}}.effects WHERE run_id = %(run)s"
               " ORDER BY recorded_at, provider, external_id",
    # The runs no process drives (journal.AbandonedRunsJournal), with since when, by the
    # database's clock: their lock expired; or no one holds them and they have not changed for
    # ``idle`` seconds, unless their compensations wait for a round that has not come.
    "runs_abandoned": f"""
SELECT {_RUN_COLUMNS} FROM (
    SELECT r.*, CASE
        WHEN r.lock_owner IS NOT NULL THEN
            CASE WHEN r.lock_expires < clock_timestamp() THEN r.lock_expires END
        WHEN w.first_due IS NOT NULL THEN
            CASE WHEN w.first_due <= clock_timestamp() THEN w.first_due END
        WHEN r.updated_at < clock_timestamp() - make_interval(secs => %(idle)s)
            THEN r.updated_at END AS since
    FROM {{s}}.runs r LEFT JOIN LATERAL (
        SELECT min(c.retry_at) AS first_due FROM {{s}}.compensations c
        WHERE c.run_id = r.run_id AND c.status = 'waiting') w ON true
    WHERE r.status IN ({", ".join(f"'{status.value}'" for status in sorted(LIVE))})) abandoned
WHERE since IS NOT NULL ORDER BY since LIMIT %(limit)s""",
}
_PURGED = ("attempts", "compensations", "approvals", "steps", "effects", "runs")
# The statuses a run may go to each status from (lifecycle.CHANGES), staying included.
_SOURCES = {new: sorted({new.value, *(old.value for old, news in CHANGES.items() if new in news)})
            for new in RunStatus}


class PostgresJournal:
    """A ``Journal`` in PostgreSQL: several processes, on several hosts, share its runs.

    Example::

        journal = PostgresJournal("postgresql://app@db/app")       # or a ConnectionPool
        journal.setup()                                            # once: creates its tables
        with PostgresSaver.from_conn_string("postgresql://app@db/app") as saver:
            saver.setup()
            guard = StateGuardCheckpointer(saver, journal=journal, compensations={...})

    ``schema`` is the PostgreSQL schema that holds its tables (``stateguard``); give each
    graph its own when sweepers recover them (``guard.sweep``). ``max_connections`` caps the
    pool it opens for a conninfo string.
    """

    def __init__(self, conn: str | psycopg.Connection[Any] | ConnectionPool[Any], *,
                 schema: str = "stateguard", max_connections: int = 8) -> None:
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigurationError(f"schema must be a lower-case PostgreSQL name (letters, "
                                     f"digits, _; at most 63), not {schema!r}")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ConfigurationError("max_connections must be a positive int")
        self.schema = schema
        self._sql = {name: text.replace("{s}", f'"{schema}"') for name, text in _SQL.items()}
        self._fences: dict[str, int] = {}  # run id -> the fencing token this journal holds
        self._pool: ConnectionPool[Any] | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._conn_lock = threading.Lock()
        self._owns_pool = False
        if isinstance(conn, str):
            try:
                psycopg.conninfo.conninfo_to_dict(conn)
            except psycopg.ProgrammingError as exc:
                raise ConfigurationError(f"not a PostgreSQL connection string: {exc}") from None
            self._pool = ConnectionPool(conn, min_size=1, max_size=max_connections,
                                        kwargs={"autocommit": True}, open=True,
                                        name=f"stateguard-journal-{schema}")
            self._owns_pool = True
        elif isinstance(conn, ConnectionPool):
            self._pool = conn
        elif isinstance(conn, psycopg.Connection):
            self._conn = conn
        else:
            raise ConfigurationError("PostgresJournal takes a conninfo string, a psycopg "
                                     f"ConnectionPool or a psycopg Connection, not {conn!r}")

    # -- connections ------------------------------------------------------------------------
    def close(self) -> None:
        """Close the pool the journal opened for a conninfo string (not one it was given)."""
        if self._owns_pool and self._pool is not None:
            self._pool.close()

    def __enter__(self) -> PostgresJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is not None:
            with self._pool.connection() as conn:
                yield conn
            return
        assert self._conn is not None
        with self._conn_lock:  # one connection: one operation at a time
            yield self._conn

    @contextmanager
    def _cursor(self) -> Iterator[Cursor]:
        with self._connection() as conn:
            if not conn.autocommit:
                raise ConfigurationError(
                    "PostgresJournal needs autocommit connections: psycopg.connect(..., "
                    "autocommit=True), or ConnectionPool(..., kwargs={'autocommit': True})")
            try:
                with conn.cursor(row_factory=tuple_row) as cur:
                    yield cur
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
                raise ConfigurationError(
                    f"the journal's tables are not in schema {self.schema!r} of this database:"
                    " call PostgresJournal.setup() once") from exc

    def _one(self, name: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        with self._cursor() as cur:
            cur.execute(self._sql[name], params)
            return cur.fetchone()

    def _all(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._cursor() as cur:
            cur.execute(self._sql[name], params)
            return cur.fetchall()

    def _write(self, name: str, params: dict[str, Any]) -> int:
        """Run a fenced write; the rows it changed. None changed while this journal holds the
        run's lease: ``LeaseLost`` if the fence is why."""
        token = params["token"] = self._fences.get(params["run"])
        with self._cursor() as cur:
            cur.execute(self._sql[name], params)
            if cur.rowcount == 0 and token is not None:
                self._check_fence(cur, params["run"], token)
            return cur.rowcount

    def _check_fence(self, cur: Cursor, run_id: str, token: int) -> None:
        # Tokens only grow: read after a refused write, a token not ours was not ours then.
        cur.execute(self._sql["run_fence"], {"run": run_id})
        row = cur.fetchone()
        if row is None or row[1] != token:
            raise LeaseLost(run_id)

    def setup(self) -> None:
        """Create the schema and its tables, or bring them up to date; safe to call on every
        start, from several processes at once (``stateguard.postgres_schema``)."""
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            apply_migrations(cur, self.schema)

    def fencing_token(self, run_id: str) -> int | None:
        """The run's fencing token, if this journal holds its lock."""
        return self._fences.get(run_id)

    # -- runs -------------------------------------------------------------------------------
    def run_begin(self, run_id: str) -> RunRecord:
        with self._cursor() as cur:
            cur.execute(self._sql["run_insert"], {"run": run_id, "status": "running",
                                                  "error": None})
            cur.execute(self._sql["run_get"], {"run": run_id})
            row = cur.fetchone()
        assert row is not None
        return run_from(row)

    def run_get(self, run_id: str) -> RunRecord | None:
        row = self._one("run_get", {"run": run_id})
        return None if row is None else run_from(row)

    def run_set_status(self, run_id: str, status: RunStatus,
                       error: ErrorInfo | None = None) -> None:
        status = RunStatus(status)
        set_error = error is not None or status in (RunStatus.RUNNING, RunStatus.SUCCEEDED)
        params = {"run": run_id, "status": status.value, "set_error": set_error,
                  "error": error_json(error), "sources": _SOURCES[status],
                  "token": self._fences.get(run_id)}
        self._changed(run_id, status, "run_set_status", params)

    def run_next_turn(self, run_id: str) -> RunRecord:
        params = {"run": run_id, "sources": _SOURCES[RunStatus.RUNNING],
                  "token": self._fences.get(run_id)}
        row = self._changed(run_id, RunStatus.RUNNING, "run_next_turn", params)
        assert row is not None
        return run_from(row)

    def _changed(self, run_id: str, status: RunStatus, name: str, params: dict[str, Any]
                 ) -> tuple[Any, ...] | None:
        """Change the run's status by the statement ``name``, which changes nothing unless
        the change is allowed and the fence holds; then say why (a run that is not there yet
        is made, in ``status``, and changed again: as ``SqliteJournal`` does)."""
        token = params["token"]
        with self._cursor() as cur:
            for _ in range(3):
                cur.execute(self._sql[name], params)
                if cur.rowcount:
                    return cur.fetchone() if cur.description else None
                cur.execute(self._sql["run_fence"], {"run": run_id})
                found = cur.fetchone()
                if found is not None and token is not None and found[1] != token:
                    raise LeaseLost(run_id)
                if found is not None:
                    check_change(found[0], status, run=run_id)  # raises if not allowed
                    continue  # its status changed between the two statements: again
                if token is not None:
                    raise LeaseLost(run_id)  # purged under our lease
                cur.execute(self._sql["run_insert"], {
                    "run": run_id, "status": status.value, "error": params.get("error")})
        raise LeaseLost(run_id)  # the run changes under us at every try: someone else has it

    def run_purge(self, run_id: str) -> None:
        with self._cursor() as cur, cur.connection.transaction():
            for table in _PURGED:
                cur.execute(f'DELETE FROM "{self.schema}".{table} WHERE run_id = %s', (run_id,))
        self._fences.pop(run_id, None)

    # -- leases -----------------------------------------------------------------------------
    def lock_acquire(self, run_id: str, owner: str, ttl: float) -> bool:
        row = self._one("lock_acquire", {"run": run_id, "owner": owner, "ttl": float(ttl)})
        if row is None:
            return False
        self._fences[run_id] = row[0]
        return True

    def lock_renew(self, run_id: str, owner: str, ttl: float) -> bool:
        with self._cursor() as cur:
            cur.execute(self._sql["lock_renew"], {"run": run_id, "owner": owner,
                                                  "ttl": float(ttl)})
            return cur.rowcount == 1

    def lock_release(self, run_id: str, owner: str) -> None:
        with self._cursor() as cur:
            cur.execute(self._sql["lock_release"], {"run": run_id, "owner": owner})
        self._fences.pop(run_id, None)

    def runs_abandoned(self, *, idle: float, limit: int) -> list[RunRecord]:
        return [run_from(r) for r in self._all("runs_abandoned", {"idle": float(idle),
                                                              "limit": int(limit)})]

    # -- steps ------------------------------------------------------------------------------
    def step_start(self, run_id: str, step_id: str, node: str,
                   tags: tuple[str, ...] = (), *, kind: str = "compensatable"
                   ) -> tuple[StepRecord, StepStatus | None]:
        params = {"run": run_id, "step": step_id, "node": node, "tags": list(tags),
                  "kind": str(kind), "token": self._fences.get(run_id)}
        with self._cursor() as cur:
            cur.execute(self._sql["step_start"], params)
            row = cur.fetchone()
        if row is None:  # only the fence refuses a start
            raise LeaseLost(run_id)
        step = StepRecord(run_id, step_id, node, tuple(tags), attempt=row[0], turn=row[2],
                          started_at=row[3], kind=str(kind))
        return step, StepStatus(row[1]) if row[1] else None

    def step_finish(self, run_id: str, step_id: str, status: StepStatus, *, update: Any = None,
                    state_after: Any = None, error: ErrorInfo | None = None) -> None:
        self._write("step_finish", {
            "run": run_id, "step": step_id, "status": StepStatus(status).value,
            "effect": int(status in EFFECT_STATUSES), "update": dumps(update),
            "state": dumps(state_after), "error": error_json(error)})

    def steps(self, run_id: str) -> list[StepRecord]:
        return [step_from(run_id, r) for r in self._all("steps", {"run": run_id})]

    def step_get(self, run_id: str, step_id: str) -> StepRecord | None:
        # The primary key (run_id, step_id): one row, whatever the run's length.
        row = self._one("step_get", {"run": run_id, "step": step_id})
        return None if row is None else step_from(run_id, row)

    # -- compensations ----------------------------------------------------------------------
    def compensation_begin(self, record: CompensationRecord) -> CompensationRecord:
        self._write("compensation_begin", {
            "run": record.run_id, "step": record.step_id, "node": record.node,
            "key": record.idempotency_key, "status": CompensationStatus(record.status).value,
            "by": record.triggered_by})
        return next(c for c in self.compensations(record.run_id)
                    if c.step_id == record.step_id)

    def compensation_attempt(self, run_id: str, step_id: str, attempt: AttemptRecord,
                             status: CompensationStatus, *, retry_at: float | None = None
                             ) -> None:
        self._write("compensation_attempt", {
            "run": run_id, "step": step_id, "status": CompensationStatus(status).value,
            "retry_at": retry_at, "number": attempt.number, "started": attempt.started_at,
            "finished": attempt.finished_at, "ok": attempt.ok, "result": attempt.result,
            "error": error_json(attempt.error)})

    def compensations(self, run_id: str) -> list[CompensationRecord]:
        with self._cursor() as cur:
            cur.execute(self._sql["attempts"], {"run": run_id})
            attempts: dict[str, list[AttemptRecord]] = {}
            for r in cur.fetchall():
                attempts.setdefault(r[0], []).append(
                    AttemptRecord(r[1], r[2], r[3], r[4], r[5], error_from(r[6])))
            cur.execute(self._sql["compensations"], {"run": run_id})
            rows = cur.fetchall()
        return [CompensationRecord(run_id, r[0], r[1], r[2], CompensationStatus(r[3]), r[4],
                                   attempts.get(r[0], []), r[5]) for r in rows]

    # -- approvals --------------------------------------------------------------------------
    def approval_request(self, record: ApprovalRecord) -> ApprovalRecord:
        self._write("approval_request", {
            "run": record.run_id, "step": record.step_id, "node": record.node,
            "payload": dumps(record.payload), "status": ApprovalStatus(record.status).value,
            "at": record.requested_at})
        return next(a for a in self.approvals(record.run_id) if a.step_id == record.step_id)

    def approval_decide(self, run_id: str, step_id: str, status: ApprovalStatus, *,
                        by: str | None, reason: str = "") -> bool:
        return self._write("approval_decide", {
            "run": run_id, "step": step_id, "status": ApprovalStatus(status).value, "by": by,
            "reason": reason}) == 1

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        return [ApprovalRecord(run_id, r[0], r[1], loads(r[2]), ApprovalStatus(r[3]), r[4],
                               r[5], r[6], r[7]) for r in self._all("approvals", {"run": run_id})]

    # -- effects ----------------------------------------------------------------------------
    # Not fenced: an effect happened whoever records it, and a worker that lost its lease has
    # still charged the card. Recording it is always right; the primary key makes it once.
    def effect_record(self, record: EffectRecord) -> EffectRecord:
        e = record.effect
        key = {"provider": e.provider, "external_id": e.external_id}
        with self._cursor() as cur, cur.connection.transaction():
            cur.execute(self._sql["effect_insert"], {
                **key, "run": record.run_id, "step": record.step_id, "node": record.node,
                "kind": e.kind, "amount": e.amount, "currency": e.currency,
                "key": e.idempotency_key, "undoes": e.undoes, "status": record.status.value,
                "at": record.recorded_at})
            cur.execute(self._sql["effect_get"], key)
            stored = effect_from(_fetched(cur))
            # Settle what it undoes, and itself (effects undoing it may have come first).
            for external_id in filter(None, (stored.effect.undoes, stored.effect.external_id)):
                self._settle(cur, e.provider, external_id)
            cur.execute(self._sql["effect_get"], key)
            return effect_from(_fetched(cur))

    def _settle(self, cur: Cursor, provider: str, external_id: str) -> None:
        key = {"provider": provider, "external_id": external_id}
        cur.execute(self._sql["effect_lock"], key)
        row = cur.fetchone()
        if row is None:
            return
        cur.execute(self._sql["effects_undoing"], key)
        undoing = [effect_from(r).effect for r in cur.fetchall()]
        status = settled_status(effect_from(row).effect, undoing)
        cur.execute(self._sql["effect_settle"], {**key, "status": status.value})

    def effects(self, run_id: str) -> list[EffectRecord]:
        return [effect_from(r) for r in self._all("effects", {"run": run_id})]


def _fetched(cur: Cursor) -> tuple[Any, ...]:
    row = cur.fetchone()
    assert row is not None
    return row
