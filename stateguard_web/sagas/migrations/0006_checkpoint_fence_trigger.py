"""Fence LangGraph's checkpoint rows in the row itself: ``sagas_fence(code, token)`` and a trigger.

A checkpoint of a leased run names the fencing token its writer holds in its metadata
(``JournalingPostgresSaver``); a trigger on ``checkpoints`` refuses the row (SQLSTATE SG001)
unless the run still has that token. BEFORE INSERT only: PostgreSQL fires it for an upsert's row
before the conflict check too, while an UPDATE of an old row (LangGraph's ``prune`` clears parent
ids) must not be fenced against the token that row was written with.

Before, each checkpoint carried a ``sagas_journal`` statement of its own for the fence alone: six
of a five-step run's thirteen, ~5 % of its CPU between the worker and PostgreSQL (P2,
docs/benchmarks.md). ``sagas_journal`` (migration 0003) keeps its
job for the writes that carry step rows, and now shares the fence with the trigger.

PostgreSQL only.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.db import migrations

TRIGGER = """
CREATE OR REPLACE FUNCTION sagas_checkpoint_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sagas_fence(NEW.thread_id::uuid,
                        (NEW.metadata->>'stateguard_fencing_token')::bigint);
    RETURN NEW;
END $$;
CREATE TRIGGER sagas_checkpoint_fence BEFORE INSERT ON checkpoints
FOR EACH ROW WHEN (NEW.metadata ? 'stateguard_fencing_token')
EXECUTE FUNCTION sagas_checkpoint_fence()"""

_0003 = importlib.import_module("stateguard_web.sagas.migrations.0003_journal_function")
# The fence as sagas_journal() had it inline: FOR SHARE, so that a takeover committing meanwhile
# makes the check wait, then fail, instead of passing on a stale snapshot.
_OLD_FENCE = """    SELECT id INTO rid FROM sagas_run
    WHERE code = run_code AND fencing_token = token FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stateguard: the lease on run % was taken over', run_code
            USING ERRCODE = 'SG001';
    END IF;
"""
assert _OLD_FENCE in _0003.CREATE
FENCE = f"""
CREATE OR REPLACE FUNCTION sagas_fence(run_code uuid, token bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    rid bigint;
BEGIN
{_OLD_FENCE}    RETURN rid;
END $$"""
JOURNAL = _0003.CREATE.replace(_OLD_FENCE, "    rid := sagas_fence(run_code, token);\n")


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for statement in (FENCE, JOURNAL, TRIGGER):
            schema_editor.execute(statement, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS sagas_checkpoint_fence ON checkpoints")
        schema_editor.execute("DROP FUNCTION IF EXISTS sagas_checkpoint_fence()")
        schema_editor.execute(_0003.CREATE, params=None)
        schema_editor.execute("DROP FUNCTION IF EXISTS sagas_fence(uuid, bigint)")


class Migration(migrations.Migration):
    dependencies = [("sagas", "0005_run_lease_updates_in_place")]
    operations = [migrations.RunPython(create, drop)]
