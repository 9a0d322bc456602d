"""What the Incidents page groups runs by (``stateguard_web/runs/incidents.py``): the step a run
failed at, its error's type and when it got there, as columns of the run with one partial index,
where they were a JSON key of the run's error and a row among the run's steps.

``Run.failed_node``, ``Run.error_type``, ``Run.incident_at``: set by a trigger whenever a run's
status becomes ``failed`` or ``needs_attention`` (``lifecycle.ATTENTION``), or its error changes
while it is in one of them, whichever write does it (the journal's SQL, a service's ``save()`` or
``update()``, the admin). The step is the run's newest failed or violated step; with none (a
worker died mid-step, an approval rejected), the newest step left started or paused; "" with
none at all, as the type is "" for a run with no error. ``incident_at`` is the ``updated_at`` of
the write that brought the run into the status (a new error for the same status keeps it).
Leaving the statuses keeps the columns (where the run last failed: the runs list can show the
runs that failed at a step and were retried since). A trigger rather than code in each writer
for the reasons of migration 0012; on PostgreSQL the WHEN clauses keep the function off every
other update (lease renewals, steps), and a write of the columns themselves (a stale object's
``save()``) is put back.

Runs that are incidents already get theirs from their steps and error now. Two partial indexes:
``sagas_run_incidents`` (the runs that are incidents now: the Incidents page's GROUP BY, alone),
``sagas_run_failed_at`` (the runs that ever were: the runs list narrowed to a step and error
type, whatever their status since).

SQLite (the embedded default) gets the same rule from AFTER triggers that update the row again,
without putting back a writer's own values of the columns (nothing but the triggers writes
them). A later migration that makes Django rebuild ``sagas_run`` on SQLite drops these triggers
with the old table (as 0012's), so it must create them again.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

INCIDENTS = "('failed', 'needs_attention')"  # lifecycle.ATTENTION
# The step a run failed at: its newest failed or violated step, else its newest unfinished one.
_STEP = """(SELECT s.node FROM sagas_step s
           WHERE s.run_id = {run}.id AND s.status IN ('failed', 'violated', 'started', 'paused')
           ORDER BY s.status IN ('failed', 'violated') DESC,
                    COALESCE(s.finished_at, s.started_at) DESC, s.id DESC
           LIMIT 1)"""
_TYPE = {"postgresql": "left(COALESCE({run}.error ->> 'type', ''), 200)",
         "sqlite": "substr(COALESCE(CASE WHEN json_valid({run}.error) "
                   "THEN json_extract({run}.error, '$.type') END, ''), 1, 200)"}

POSTGRESQL = f"""
CREATE OR REPLACE FUNCTION sagas_run_incident() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN {INCIDENTS} AND (TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status
                                      OR NEW.error IS DISTINCT FROM OLD.error) THEN
        NEW.error_type := {_TYPE["postgresql"].format(run="NEW")};
        NEW.failed_node := COALESCE({_STEP.format(run="NEW")}, '');
        IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
            NEW.incident_at := COALESCE(NEW.updated_at, statement_timestamp());
        ELSE
            NEW.incident_at := OLD.incident_at;  -- the same incident, its error reworded
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
        NEW.failed_node := NULL;
        NEW.error_type := NULL;
        NEW.incident_at := NULL;
    ELSE  -- only this trigger writes them: whatever another writer said is put back
        NEW.failed_node := OLD.failed_node;
        NEW.error_type := OLD.error_type;
        NEW.incident_at := OLD.incident_at;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sagas_run_incident_insert BEFORE INSERT ON sagas_run FOR EACH ROW
WHEN (NEW.status IN {INCIDENTS} OR NEW.failed_node IS NOT NULL OR NEW.error_type IS NOT NULL
      OR NEW.incident_at IS NOT NULL)
EXECUTE FUNCTION sagas_run_incident();
CREATE TRIGGER sagas_run_incident_update BEFORE UPDATE ON sagas_run FOR EACH ROW
WHEN ((NEW.status IN {INCIDENTS} AND (NEW.status IS DISTINCT FROM OLD.status
                                      OR NEW.error IS DISTINCT FROM OLD.error))
      OR NEW.failed_node IS DISTINCT FROM OLD.failed_node
      OR NEW.error_type IS DISTINCT FROM OLD.error_type
      OR NEW.incident_at IS DISTINCT FROM OLD.incident_at)
EXECUTE FUNCTION sagas_run_incident()"""

POSTGRESQL_DROP = """
DROP TRIGGER IF EXISTS sagas_run_incident_update ON sagas_run;
DROP TRIGGER IF EXISTS sagas_run_incident_insert ON sagas_run;
DROP FUNCTION IF EXISTS sagas_run_incident()"""

# SQLite runs one statement per execute(). A run just inserted has no steps yet.
SQLITE = [
    f"""CREATE TRIGGER sagas_run_incident_insert AFTER INSERT ON sagas_run
    WHEN NEW.status IN {INCIDENTS}
    BEGIN UPDATE sagas_run SET error_type = {_TYPE["sqlite"].format(run="NEW")},
        failed_node = '', incident_at = NEW.updated_at
    WHERE id = NEW.id; END""",
    f"""CREATE TRIGGER sagas_run_incident_set AFTER UPDATE ON sagas_run
    WHEN NEW.status IN {INCIDENTS} AND (NEW.status IS NOT OLD.status
                                        OR NEW.error IS NOT OLD.error)
    BEGIN UPDATE sagas_run SET error_type = {_TYPE["sqlite"].format(run="NEW")},
        failed_node = COALESCE({_STEP.format(run="NEW")}, ''),
        incident_at = CASE WHEN NEW.status IS NOT OLD.status THEN NEW.updated_at
                           ELSE OLD.incident_at END
    WHERE id = NEW.id; END""",
]
SQLITE_DROP = [f"DROP TRIGGER IF EXISTS sagas_run_incident_{name}" for name in ("insert", "set")]


def backfill(apps: Any, schema_editor: Any) -> None:
    """The runs that are incidents now, before the triggers exist (the PostgreSQL one would put
    back a direct write of the columns)."""
    vendor = schema_editor.connection.vendor
    if vendor not in _TYPE:
        return
    schema_editor.execute(
        f"UPDATE sagas_run SET error_type = {_TYPE[vendor].format(run='sagas_run')}, "
        f"failed_node = COALESCE({_STEP.format(run='sagas_run')}, ''), "
        f"incident_at = updated_at WHERE status IN {INCIDENTS}", params=None)


def create(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    for statement in {"postgresql": [POSTGRESQL], "sqlite": SQLITE}.get(vendor, []):
        schema_editor.execute(statement, params=None)


def drop(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    for statement in {"postgresql": [POSTGRESQL_DROP], "sqlite": SQLITE_DROP}.get(vendor, []):
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):
    dependencies = [("sagas", "0021_run_lease_lock")]

    operations = [
        migrations.AddField(
            model_name="run", name="failed_node",
            field=models.CharField(blank=True, editable=False, max_length=200, null=True)),
        migrations.AddField(
            model_name="run", name="error_type",
            field=models.CharField(blank=True, editable=False, max_length=200, null=True)),
        migrations.AddField(
            model_name="run", name="incident_at",
            field=models.DateTimeField(blank=True, editable=False, null=True)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(create, drop),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ["failed", "needs_attention"])),
                fields=["agent", "failed_node", "error_type", "status", "incident_at"],
                name="sagas_run_incidents")),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("failed_node__isnull", False)),
                fields=["agent", "failed_node", "error_type", "status", "incident_at"],
                name="sagas_run_failed_at")),
    ]
