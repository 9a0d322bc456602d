"""The outbox: a ``webhooks_delivery`` row written by the statement that changes a run's
status to one that makes an event (``models.EVENT_TYPES``), if the run has a webhook.

A trigger rather than code in each writer (as migration sagas 0012 explains): the worker's
status writes are hand-made SQL (``django_journal``), and the row must be in the same
transaction as the change: written if and only if the change commits, whichever process dies
after. On PostgreSQL the WHEN clause keeps the function off every other update of a run
(leases, steps); a run without a webhook costs one index lookup per such status change.

SQLite (the embedded default) gets the same from its own trigger. A later migration that
makes Django rebuild ``sagas_run`` on SQLite drops it with the old table, so must create it
again (as 0012's).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

STATUSES = "('succeeded', 'compensated', 'failed', 'needs_attention', 'paused')"
_TYPE = "CASE NEW.status WHEN 'paused' THEN 'run.awaiting_approval' ELSE 'run.' || NEW.status END"
_COLUMNS = "event_id, run_id, type, data, status, attempts, next_attempt_at, created_at"

POSTGRESQL = f"""
CREATE OR REPLACE FUNCTION webhooks_run_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhooks_delivery ({_COLUMNS})
    SELECT 'evt_' || replace(gen_random_uuid()::text, '-', ''), NEW.id, {_TYPE},
           jsonb_build_object('code', NEW.code, 'agent', NEW.agent, 'status', NEW.status,
                              'error', NEW.error, 'submitted_at', NEW.created_at),
           'pending', 0, statement_timestamp(), statement_timestamp()
    FROM webhooks_runwebhook WHERE run_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER webhooks_run_event AFTER UPDATE OF status ON sagas_run FOR EACH ROW
WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN {STATUSES})
EXECUTE FUNCTION webhooks_run_event()"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS webhooks_run_event ON sagas_run;
DROP FUNCTION IF EXISTS webhooks_run_event()"""

_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
SQLITE = f"""
CREATE TRIGGER webhooks_run_event AFTER UPDATE OF status ON sagas_run
WHEN NEW.status IS NOT OLD.status AND NEW.status IN {STATUSES}
BEGIN
    INSERT INTO webhooks_delivery ({_COLUMNS})
    SELECT 'evt_' || lower(hex(randomblob(16))), NEW.id, {_TYPE},
           json_object('code', NEW.code, 'agent', NEW.agent, 'status', NEW.status,
                       'error', json(NEW.error), 'submitted_at', NEW.created_at),
           'pending', 0, {_NOW}, {_NOW}
    FROM webhooks_runwebhook WHERE run_id = NEW.id;
END"""
SQLITE_DROP = "DROP TRIGGER IF EXISTS webhooks_run_event"


def create(apps: Any, schema_editor: Any) -> None:
    statement = {"postgresql": POSTGRESQL, "sqlite": SQLITE}.get(schema_editor.connection.vendor)
    if statement:  # params=None: the % in strftime's format goes as written
        schema_editor.execute(statement, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    statement = {"postgresql": POSTGRESQL_DROP,
                 "sqlite": SQLITE_DROP}.get(schema_editor.connection.vendor)
    if statement:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
