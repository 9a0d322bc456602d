"""Audit events append-only in the database: triggers refuse UPDATE and DELETE of ``sagas_auditevent``.

``AuditEvent.save()`` and ``.delete()`` refuse already, but ``QuerySet.update()``, ``.delete()``
and raw SQL go around the model. A trigger catches them all. Not revoked rights: the deployment
(docs/deploy.md) runs the app and its migrations as one role, which owns the tables and could grant
the rights back to itself; and the one update below must still pass.

The one update let through: setting ``run_id`` to NULL, and nothing else, when the event's run is
deleted. ``AuditEvent.run`` is ``on_delete=SET_NULL``, so Django runs that update before it deletes
a run. Refusing it would make runs undeletable: every run has at least its ``run.submitted``
event. Runs will be pruned, and their trail is worth keeping longer than the runs. A deferred
constraint trigger checks at commit that the run is really gone, so that ``update(run=None)``
alone cannot quietly detach a run's events from it. The refusals are ``restrict_violation``
(SQLSTATE 23001): Django raises ``IntegrityError``, as SQLite does for ``RAISE(ABORT)``.

TRUNCATE is not blocked. Django's ``flush`` on PostgreSQL (which pytest-django runs after every
transactional test) and the benchmarks (bench/p2_throughput.py) empty the tables with it. It
needs the table's owner or the TRUNCATE right, and that role can drop these triggers anyway:
they keep the application (ORM, admin, raw SQL) from rewriting history, not the database's owner.

SQLite (the embedded default) gets the same rule from two triggers, but without the check at
commit: SQLite has no deferred triggers, and Django nulls ``run_id`` before it deletes the run.
The SQLite trigger lists the columns it compares, while the PostgreSQL one compares whole rows
(0013 adds ``run_code`` to that list). SQLite has no TRUNCATE: Django's ``flush`` there is
``DELETE FROM``, which the DELETE trigger refuses, so the sagas app's ``flush`` command lifts
that trigger for the flush alone, in the flush's transaction (management/commands/flush.py).

For later migrations: on PostgreSQL, one that rewrites audit rows must disable the trigger
around its UPDATE. On SQLite, one that makes Django rebuild ``sagas_auditevent`` (most
``AlterField``s) drops these triggers with the old table, so it must create them again.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

POSTGRESQL = """
CREATE OR REPLACE FUNCTION sagas_auditevent_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.run_id IS NOT NULL AND NEW.run_id IS NULL
       AND to_jsonb(NEW) - 'run_id' = to_jsonb(OLD) - 'run_id' THEN
        RETURN NEW;  -- on_delete=SET_NULL; sagas_auditevent_detached checks it at commit
    END IF;
    RAISE EXCEPTION 'stateguard: audit events are append-only (% of event %)', TG_OP, OLD.id
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER sagas_auditevent_append_only BEFORE UPDATE OR DELETE ON sagas_auditevent
FOR EACH ROW EXECUTE FUNCTION sagas_auditevent_append_only();

CREATE OR REPLACE FUNCTION sagas_auditevent_detached() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sagas_run WHERE id = OLD.run_id) THEN
        RAISE EXCEPTION 'stateguard: audit event % was taken off run %, which was not deleted',
            OLD.id, OLD.run_id USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER sagas_auditevent_detached AFTER UPDATE ON sagas_auditevent
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sagas_auditevent_detached()"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS sagas_auditevent_detached ON sagas_auditevent;
DROP FUNCTION IF EXISTS sagas_auditevent_detached();
DROP TRIGGER IF EXISTS sagas_auditevent_append_only ON sagas_auditevent;
DROP FUNCTION IF EXISTS sagas_auditevent_append_only()"""

# SQLite runs one statement per execute().
SQLITE = [
    """CREATE TRIGGER sagas_auditevent_no_update BEFORE UPDATE ON sagas_auditevent
    WHEN NOT (OLD.run_id IS NOT NULL AND NEW.run_id IS NULL AND NEW.id IS OLD.id
              AND NEW.actor IS OLD.actor AND NEW.action IS OLD.action
              AND NEW.data IS OLD.data AND NEW.created_at IS OLD.created_at)
    BEGIN SELECT RAISE(ABORT, 'stateguard: audit events are append-only'); END""",
    """CREATE TRIGGER sagas_auditevent_no_delete BEFORE DELETE ON sagas_auditevent
    BEGIN SELECT RAISE(ABORT, 'stateguard: audit events are append-only'); END""",
]
SQLITE_DROP = ["DROP TRIGGER IF EXISTS sagas_auditevent_no_update",
               "DROP TRIGGER IF EXISTS sagas_auditevent_no_delete"]


def create(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    # params=None: the SQL goes as written, and the % in RAISE's format stays as it is.
    for statement in {"postgresql": [POSTGRESQL], "sqlite": SQLITE}.get(vendor, []):
        schema_editor.execute(statement, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    for statement in {"postgresql": [POSTGRESQL_DROP], "sqlite": SQLITE_DROP}.get(vendor, []):
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("sagas", "0006_checkpoint_fence_trigger")]
    operations = [migrations.RunPython(create, drop)]
