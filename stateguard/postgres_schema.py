"""The tables of ``PostgresJournal``, in a schema of their own, and ``setup`` that makes them.

Every table lives in one PostgreSQL schema (``stateguard`` unless the journal is given
another), so a database may hold several journals (one per graph that a sweeper recovers, one
per test) and the application's own tables stay apart:

- ``runs``: one row per run (a LangGraph thread): its status, turn, error, lease (owner, expiry
  by the database's clock) and fencing token, and the counter that numbers its completions;
- ``steps``, ``compensations`` (with ``attempts``), ``approvals``: keyed by run and step;
- ``effects``: keyed by provider and the provider's id;
- ``migrations``: which of ``MIGRATIONS`` were applied.

``setup`` applies the migrations not applied yet, each in a transaction, under an advisory lock
(two processes setting up at once wait for each other instead of colliding), so it is safe to
call on every start. Changing the tables means appending a migration, never editing one.
"""

from __future__ import annotations

from typing import Any

# Times the journal decides (a lease's expiry, when a step started or a run changed) come from
# the database's clock; times a caller passes in its records (an attempt's, a retry_at) are
# stored as given. Statuses are checked by the table, as the web app's models check theirs.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE {s}.runs (
            run_id text PRIMARY KEY,
            status text NOT NULL CONSTRAINT runs_status_valid CHECK (status IN ('pending',
                'running', 'paused', 'failed', 'succeeded', 'compensating', 'compensated',
                'needs_attention')),
            error json,
            turn integer NOT NULL DEFAULT 1,
            lock_owner text,
            lock_expires timestamptz,
            fencing_token bigint NOT NULL DEFAULT 0,
            done_seq integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        # The live few among all runs, for runs_abandoned (a sweep every few seconds).
        "CREATE INDEX runs_live ON {s}.runs (run_id)"
        " WHERE status IN ('running', 'compensating')",
        """CREATE TABLE {s}.steps (
            run_id text NOT NULL,
            step_id text NOT NULL,
            node text NOT NULL,
            tags text[] NOT NULL,
            status text NOT NULL CONSTRAINT steps_status_valid CHECK (status IN ('started',
                'paused', 'succeeded', 'failed', 'violated', 'rewound')),
            prev_status text,
            attempt integer NOT NULL,
            kind text NOT NULL DEFAULT 'compensatable',
            turn integer NOT NULL DEFAULT 1,
            started_at timestamptz NOT NULL,
            finished_at timestamptz,
            done_seq integer,
            update_json json,
            state_after json,
            error json,
            PRIMARY KEY (run_id, step_id))""",
        """CREATE TABLE {s}.compensations (
            run_id text NOT NULL,
            step_id text NOT NULL,
            node text NOT NULL,
            idempotency_key text NOT NULL,
            status text NOT NULL CONSTRAINT compensations_status_valid CHECK (status IN (
                'running', 'succeeded', 'nothing_to_undo', 'failed', 'skipped_in_doubt',
                'waiting')),
            triggered_by text NOT NULL,
            retry_at timestamptz,
            begun_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (run_id, step_id))""",
        # The waiting few, for runs_abandoned (is a run's next round due?).
        "CREATE INDEX compensations_waiting ON {s}.compensations (run_id)"
        " WHERE status = 'waiting'",
        """CREATE TABLE {s}.attempts (
            run_id text NOT NULL,
            step_id text NOT NULL,
            number integer NOT NULL,
            started_at timestamptz NOT NULL,
            finished_at timestamptz NOT NULL,
            ok boolean NOT NULL,
            result text NOT NULL,
            error json,
            PRIMARY KEY (run_id, step_id, number))""",
        """CREATE TABLE {s}.approvals (
            run_id text NOT NULL,
            step_id text NOT NULL,
            node text NOT NULL,
            payload json,
            status text NOT NULL CONSTRAINT approvals_status_valid CHECK (status IN (
                'pending', 'approved', 'rejected')),
            decided_by text,
            reason text NOT NULL DEFAULT '',
            requested_at timestamptz NOT NULL,
            decided_at timestamptz,
            PRIMARY KEY (run_id, step_id))""",
        """CREATE TABLE {s}.effects (
            provider text NOT NULL,
            external_id text NOT NULL,
            run_id text NOT NULL,
            step_id text NOT NULL,
            node text NOT NULL,
            kind text NOT NULL,
            amount bigint,
            currency text NOT NULL,
            idempotency_key text NOT NULL,
            undoes text NOT NULL,
            status text NOT NULL,
            recorded_at timestamptz NOT NULL,
            PRIMARY KEY (provider, external_id))""",
        "CREATE INDEX effects_run ON {s}.effects (run_id)",  # effects(run_id)
        "CREATE INDEX effects_undoes ON {s}.effects (provider, undoes)",  # settling a charge
    ),
)


def apply_migrations(cur: Any, schema: str) -> list[int]:
    """Create the schema and apply the migrations it lacks, in the caller's transaction
    (``cur`` is a psycopg cursor); return the versions applied now."""
    quoted = f'"{schema}"'
    # Serialize set-ups of this schema across processes (released at the transaction's end).
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"stateguard.setup:{schema}",))
    cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
    cur.execute(f"CREATE TABLE IF NOT EXISTS {quoted}.migrations (v integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())")
    cur.execute(f"SELECT v FROM {quoted}.migrations")
    done = {row[0] for row in cur.fetchall()}
    applied = []
    for version, statements in enumerate(MIGRATIONS):
        if version in done:
            continue
        for statement in statements:
            cur.execute(statement.format(s=quoted))
        cur.execute(f"INSERT INTO {quoted}.migrations (v) VALUES (%s)", (version,))
        applied.append(version)
    return applied
