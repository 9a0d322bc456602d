"""What GET /metrics reads (``stateguard_web/monitoring/journal_metrics.py``): when each run first reached an
outcome, and indexes to read what finished since the last scrape.

``Run.finished_at`` and ``Run.finished_status``: set once, by a trigger, when a run first gets
one of the outcomes ``succeeded``, ``compensated`` or ``needs_attention``, whichever write
gets it there (the journal's SQL, a service's ``save()``, the admin); never changed after, so
a run later compensated by hand still counts once, with its first duration. A trigger rather
than code in each writer: the worker's status writes are hand-made SQL (``django_journal``),
and a stale object's ``save()`` must not move the value. On PostgreSQL the triggers' WHEN
clauses keep the trigger function off every other update (lease renewals, steps).
Runs already settled get their ``updated_at`` as ``finished_at``.

Indexes (partial where rows without the key are common), each named for the scrape query:
``sagas_step_finished``, ``sagas_run_finished``, ``sagas_attempt_finished``.

SQLite (the embedded default) gets the same rule from AFTER triggers that update the row again
(SQLite's BEFORE triggers cannot change NEW). A later migration that makes Django rebuild
``sagas_run`` on SQLite (most ``AlterField``s) drops these triggers with the old table, so it
must create them again.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

OUTCOMES = "('succeeded', 'compensated', 'needs_attention')"

POSTGRESQL = f"""
CREATE OR REPLACE FUNCTION sagas_run_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.finished_at IS NOT NULL THEN
        NEW.finished_at := OLD.finished_at;  -- set once
        NEW.finished_status := OLD.finished_status;
    ELSIF NEW.status IN {OUTCOMES} THEN
        NEW.finished_at := COALESCE(NEW.finished_at, statement_timestamp());
        NEW.finished_status := NEW.status;
    ELSE
        NEW.finished_at := NULL;  -- not finished yet, whatever a writer said
        NEW.finished_status := '';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sagas_run_finished_insert BEFORE INSERT ON sagas_run FOR EACH ROW
WHEN (NEW.status IN {OUTCOMES} OR NEW.finished_at IS NOT NULL OR NEW.finished_status <> '')
EXECUTE FUNCTION sagas_run_finished();
CREATE TRIGGER sagas_run_finished_update BEFORE UPDATE ON sagas_run FOR EACH ROW
WHEN (CASE WHEN OLD.finished_at IS NULL
           THEN NEW.status IN {OUTCOMES} OR NEW.finished_at IS NOT NULL
                OR NEW.finished_status <> ''
           ELSE NEW.finished_at IS DISTINCT FROM OLD.finished_at
                OR NEW.finished_status IS DISTINCT FROM OLD.finished_status END)
EXECUTE FUNCTION sagas_run_finished()"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS sagas_run_finished_update ON sagas_run;
DROP TRIGGER IF EXISTS sagas_run_finished_insert ON sagas_run;
DROP FUNCTION IF EXISTS sagas_run_finished()"""

# SQLite runs one statement per execute(); Django stores datetimes as UTC text.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_CHANGES = (f"(NEW.status IN {OUTCOMES} OR NEW.finished_at IS NOT NULL "
            f"OR NEW.finished_status <> '')")
SQLITE = [
    f"""CREATE TRIGGER sagas_run_finished_insert AFTER INSERT ON sagas_run
    WHEN {_CHANGES}
    BEGIN UPDATE sagas_run SET
        finished_at = CASE WHEN NEW.status IN {OUTCOMES}
                           THEN COALESCE(NEW.finished_at, {_NOW}) END,
        finished_status = CASE WHEN NEW.status IN {OUTCOMES} THEN NEW.status ELSE '' END
    WHERE id = NEW.id; END""",
    f"""CREATE TRIGGER sagas_run_finished_set AFTER UPDATE ON sagas_run
    WHEN OLD.finished_at IS NULL AND {_CHANGES}
         -- not the row as sagas_run_finished_keep puts it back (that update fires this too)
         AND NOT (NEW.finished_at IS NOT NULL AND NEW.finished_status IN {OUTCOMES})
    BEGIN UPDATE sagas_run SET
        finished_at = CASE WHEN NEW.status IN {OUTCOMES}
                           THEN COALESCE(NEW.finished_at, {_NOW}) END,
        finished_status = CASE WHEN NEW.status IN {OUTCOMES} THEN NEW.status ELSE '' END
    WHERE id = NEW.id; END""",
    """CREATE TRIGGER sagas_run_finished_keep AFTER UPDATE ON sagas_run
    WHEN OLD.finished_at IS NOT NULL AND (NEW.finished_at IS NOT OLD.finished_at
                                         OR NEW.finished_status IS NOT OLD.finished_status)
    BEGIN UPDATE sagas_run SET finished_at = OLD.finished_at,
                               finished_status = OLD.finished_status
    WHERE id = NEW.id; END""",
]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS sagas_run_finished_{name}"
               for name in ("insert", "set", "keep")]


def backfill(apps: Any, schema_editor: Any) -> None:
    schema_editor.execute(f"UPDATE sagas_run SET finished_at = updated_at, "
                          f"finished_status = status WHERE status IN {OUTCOMES}", params=None)


def create(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    # params=None: the SQL goes as written (the % in strftime's format stays as it is).
    for statement in {"postgresql": [POSTGRESQL], "sqlite": SQLITE}.get(vendor, []):
        schema_editor.execute(statement, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    for statement in {"postgresql": [POSTGRESQL_DROP], "sqlite": SQLITE_DROP}.get(vendor, []):
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("sagas", "0011_run_permissions")]

    operations = [
        migrations.AddField(
            model_name="run", name="finished_at",
            field=models.DateTimeField(blank=True, editable=False, null=True)),
        migrations.AddField(
            model_name="run", name="finished_status",
            field=models.CharField(blank=True, default="", editable=False, max_length=20)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(create, drop),
        migrations.AddIndex(
            model_name="step",
            index=models.Index(condition=models.Q(finished_at__isnull=False),
                               fields=["finished_at"], name="sagas_step_finished")),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(condition=models.Q(finished_at__isnull=False),
                               fields=["finished_at"], name="sagas_run_finished")),
        migrations.AddIndex(
            model_name="compensationattempt",
            index=models.Index(fields=["finished_at"], name="sagas_attempt_finished")),
    ]
