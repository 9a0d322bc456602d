"""When a worker first took each run from the queue: ``Run.started_at``, for the workers page
(runs started per minute, how long runs queue).

Set once, by a trigger, when a run first has a status other than ``pending``, whichever write
gets it there (the journal's SQL, which writes ``running`` with the first checkpoint; a
service's ``save()``; the admin); never changed after, so a run retried later keeps its first
start. A trigger, as for ``finished_at`` (migration 0012), because the worker's status writes
are hand-made SQL and a stale object's ``save()`` must not move the value. On PostgreSQL the
triggers' WHEN clauses keep the function off every other update (lease renewals). A writer
that names a time (the tests' worlds) keeps it.

Runs past pending before this migration get their first step's start, or their creation when
they have no step: the chart of the hour after an upgrade is about right, not exact.

SQLite gets the same rule from AFTER triggers (its BEFORE triggers cannot change NEW), which
a migration that rebuilds ``sagas_run`` there drops (see 0012): it must create them again.
The column is nullable with no default, so adding it rebuilds nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from stateguard_web.sagas.migrations._vendor_sql import run_sql

POSTGRESQL = """
CREATE OR REPLACE FUNCTION sagas_run_started() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.started_at IS NOT NULL THEN
        NEW.started_at := OLD.started_at;  -- set once
    ELSIF NEW.status <> 'pending' THEN
        NEW.started_at := COALESCE(NEW.started_at, statement_timestamp());
    ELSE
        NEW.started_at := NULL;  -- still queued, whatever a writer said
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sagas_run_started_insert BEFORE INSERT ON sagas_run FOR EACH ROW
WHEN (NEW.status <> 'pending' OR NEW.started_at IS NOT NULL)
EXECUTE FUNCTION sagas_run_started();
CREATE TRIGGER sagas_run_started_update BEFORE UPDATE ON sagas_run FOR EACH ROW
WHEN (CASE WHEN OLD.started_at IS NULL
           THEN NEW.status <> 'pending' OR NEW.started_at IS NOT NULL
           ELSE NEW.started_at IS DISTINCT FROM OLD.started_at END)
EXECUTE FUNCTION sagas_run_started()"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS sagas_run_started_update ON sagas_run;
DROP TRIGGER IF EXISTS sagas_run_started_insert ON sagas_run;
DROP FUNCTION IF EXISTS sagas_run_started()"""

# SQLite runs one statement per execute(); Django stores datetimes as UTC text.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_SET = f"""UPDATE sagas_run SET started_at = CASE WHEN NEW.status <> 'pending'
                                  THEN COALESCE(NEW.started_at, {_NOW}) END
    WHERE id = NEW.id"""
SQLITE = [
    f"""CREATE TRIGGER sagas_run_started_insert AFTER INSERT ON sagas_run
    WHEN NEW.status <> 'pending' OR NEW.started_at IS NOT NULL
    BEGIN {_SET}; END""",
    f"""CREATE TRIGGER sagas_run_started_set AFTER UPDATE ON sagas_run
    WHEN OLD.started_at IS NULL
         AND ((NEW.status <> 'pending' AND NEW.started_at IS NULL)
              OR (NEW.status = 'pending' AND NEW.started_at IS NOT NULL))
    BEGIN {_SET}; END""",
    """CREATE TRIGGER sagas_run_started_keep AFTER UPDATE ON sagas_run
    WHEN OLD.started_at IS NOT NULL AND NEW.started_at IS NOT OLD.started_at
    BEGIN UPDATE sagas_run SET started_at = OLD.started_at WHERE id = NEW.id; END""",
]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS sagas_run_started_{name}"
               for name in ("insert", "set", "keep")]


def backfill(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(
        "UPDATE sagas_run SET started_at = COALESCE((SELECT MIN(s.started_at) FROM sagas_step s"
        " WHERE s.run_id = sagas_run.id), created_at) WHERE status <> 'pending'", params=None)


class Migration(migrations.Migration):
    dependencies = [("sagas", "0023_run_purged_at")]

    operations = [
        migrations.AddField(
            model_name="run", name="started_at",
            field=models.DateTimeField(blank=True, editable=False, null=True)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        run_sql({"postgresql": [POSTGRESQL], "sqlite": SQLITE},
                {"postgresql": [POSTGRESQL_DROP], "sqlite": SQLITE_DROP}),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=models.Q(started_at__isnull=False),
                               fields=["started_at"], name="sagas_run_started")),
    ]
