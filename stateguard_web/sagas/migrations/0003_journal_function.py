"""``sagas_journal(code, token, status, steps)``: the journal's writes that travel with
LangGraph's checkpoint writes (``step_rows``), in one statement.

It raises SQLSTATE SG001 unless the run's fencing token is still ``token``: sent in the same
transaction as LangGraph's writes, it keeps a worker that lost its lease from writing checkpoints
or step rows. The run row is locked (FOR SHARE, or by the status update): a takeover committing
meanwhile makes the check wait, then fail. Then it sets the run's status (if not NULL) and
upserts the step rows (a JSON array, in order: each finished step with an effect gets the next
completion number of its run).

PostgreSQL only: on SQLite the journal writes every row on its own, fenced in its statement.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION sagas_journal(run_code uuid, token bigint, run_status text,
                                         steps jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    rid bigint;
    s record;
BEGIN
    SELECT id INTO rid FROM sagas_run
    WHERE code = run_code AND fencing_token = token FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stateguard: the lease on run % was taken over', run_code
            USING ERRCODE = 'SG001';
    END IF;
    IF run_status IS NOT NULL THEN
        UPDATE sagas_run SET status = run_status, updated_at = now(), error = NULL
        WHERE id = rid;
    END IF;
    FOR s IN SELECT * FROM jsonb_to_recordset(COALESCE(steps, '[]'::jsonb)) AS x(
            step_id text, node text, tags jsonb, status text, started_at timestamptz,
            finished_at timestamptz, "update" jsonb, state_after jsonb, error jsonb,
            effect boolean, new boolean) LOOP
        -- new: this row starts the step (a first run, or a re-run: attempt + 1); else it
        -- finishes a start written earlier.
        INSERT INTO sagas_step AS t (run_id, step_id, node, tags, status, attempt, started_at,
                                     finished_at, "update", state_after, error, done_seq)
        VALUES (rid, s.step_id, s.node, s.tags, s.status, 1, s.started_at, s.finished_at,
                s."update", s.state_after, s.error,
                CASE WHEN s.effect THEN (SELECT COALESCE(MAX(d.done_seq), 0) + 1
                                         FROM sagas_step d WHERE d.run_id = rid) END)
        ON CONFLICT (run_id, step_id) DO UPDATE SET
            prev_status = CASE WHEN s.new THEN t.status ELSE t.prev_status END,
            attempt = t.attempt + CASE WHEN s.new THEN 1 ELSE 0 END,
            node = excluded.node, tags = excluded.tags, status = excluded.status,
            started_at = excluded.started_at, finished_at = excluded.finished_at,
            "update" = excluded."update", state_after = excluded.state_after,
            error = excluded.error, done_seq = excluded.done_seq;
    END LOOP;
END $$"""


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS sagas_journal(uuid, bigint, text, jsonb)")


class Migration(migrations.Migration):
    dependencies = [("sagas", "0002_langgraph_checkpoints")]
    operations = [migrations.RunPython(create, drop)]
