"""Audit events name their run by its code (``AuditEvent.run_code``), which outlives the run.

Deleting a run sets its events' ``run`` to NULL (migration 0007: the trail outlives the run),
and nothing then said which run they were about. ``run_code`` is the run's public UUID, copied
by ``AuditEvent.save()`` when an event is made; this migration fills it in for the events
already there whose run still exists (those of runs already deleted cannot be told).

The append-only triggers of 0007 cover the new column. PostgreSQL's compares whole rows but
``run_id``, so ``run_code`` can never change there, and the one update let through is still the
SET NULL of a run's deletion. SQLite's lists the columns it compares, so it is made again here
with ``run_code`` among them (same name; going back restores 0007's). The fill below is the
one rewrite of audit rows, with the triggers off around it as 0007 asks, in this migration's
transaction. The index after the fill: one build instead of one insert per row.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.db import migrations, models

POSTGRESQL_FILL = """
ALTER TABLE sagas_auditevent DISABLE TRIGGER sagas_auditevent_append_only,
    DISABLE TRIGGER sagas_auditevent_detached;
UPDATE sagas_auditevent AS e SET run_code = r.code FROM sagas_run AS r WHERE r.id = e.run_id;
ALTER TABLE sagas_auditevent ENABLE TRIGGER sagas_auditevent_append_only,
    ENABLE TRIGGER sagas_auditevent_detached"""

SQLITE_NO_UPDATE = """CREATE TRIGGER sagas_auditevent_no_update BEFORE UPDATE ON sagas_auditevent
    WHEN NOT (OLD.run_id IS NOT NULL AND NEW.run_id IS NULL AND NEW.id IS OLD.id
              AND NEW.actor IS OLD.actor AND NEW.action IS OLD.action
              AND NEW.data IS OLD.data AND NEW.created_at IS OLD.created_at
              AND NEW.run_code IS OLD.run_code)
    BEGIN SELECT RAISE(ABORT, 'stateguard: audit events are append-only'); END"""
SQLITE_FILL = [
    "DROP TRIGGER IF EXISTS sagas_auditevent_no_update",
    """UPDATE sagas_auditevent SET run_code = (
        SELECT code FROM sagas_run WHERE sagas_run.id = sagas_auditevent.run_id)
    WHERE run_id IS NOT NULL""",
    SQLITE_NO_UPDATE,
]


def _sqlite_0007() -> list[str]:
    """0007's UPDATE trigger, without ``run_code``: what going back restores."""
    m0007 = importlib.import_module("stateguard_web.sagas.migrations.0007_auditevent_append_only")
    return [s for s in m0007.SQLITE if "sagas_auditevent_no_update" in s]


def fill(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    # params=None: the SQL goes as written.
    for statement in {"postgresql": [POSTGRESQL_FILL], "sqlite": SQLITE_FILL}.get(vendor, []):
        schema_editor.execute(statement, params=None)


def unfill(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "sqlite":  # before the column goes: SQLite refuses to
        # drop a column that a trigger names
        schema_editor.execute("DROP TRIGGER IF EXISTS sagas_auditevent_no_update", params=None)
        for statement in _sqlite_0007():
            schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("sagas", "0012_metrics")]
    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="run_code",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(fill, unfill),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(fields=["run_code"], name="sagas_audit_run_code"),
        ),
    ]
