"""The audit trail is append-only in the database (migration 0007), not only in the model."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import TestCase

from stateguard_web.sagas.models import AuditEvent, Run
from tests.web.conftest import ManagePy


class AppendOnlyTests(TestCase):
    def setUp(self) -> None:
        self.run = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        AuditEvent.objects.create(run=self.run, actor="alice", action="run.submitted")
        AuditEvent.objects.create(run=self.run, actor="bob", action="run.approved")

    def trail(self) -> list[tuple[int | None, str, str]]:
        return list(AuditEvent.objects.order_by("pk").values_list("run", "actor", "action"))

    def test_it_refuses_updates_and_deletes_that_go_around_the_model(self) -> None:
        before = self.trail()
        changes = [
            lambda: AuditEvent.objects.filter(run=self.run).update(action="x"),
            lambda: AuditEvent.objects.filter(actor="bob").delete(),
            lambda: AuditEvent.objects.all().delete(),
            # The update a run's deletion makes, with one more change smuggled in.
            lambda: AuditEvent.objects.filter(run=self.run).update(run=None, actor="mallory"),
        ]
        for change in changes:
            # atomic: the refused statement aborts only its savepoint, not the test's transaction.
            with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
                change()
        with pytest.raises(IntegrityError, match="append-only"), connection.cursor() as cursor, \
                transaction.atomic():
            cursor.execute("UPDATE sagas_auditevent SET data = '{}'::jsonb")
        assert self.trail() == before

    def test_it_takes_events_off_their_run_only_when_the_run_is_deleted(self) -> None:
        # update(run=None) alone passes the row trigger (only run_id changes), not the commit.
        with pytest.raises(IntegrityError, match="was not deleted"), transaction.atomic():
            AuditEvent.objects.filter(run=self.run).update(run=None)
            connection.check_constraints()  # what the commit checks
        assert AuditEvent.objects.filter(run=self.run).count() == 2
        # Deleting the run sets run_id to NULL (on_delete=SET_NULL): runs can be pruned, and
        # their trail stays.
        self.run.delete()
        connection.check_constraints()
        assert self.trail() == [(None, "alice", "run.submitted"), (None, "bob", "run.approved")]

    def test_it_names_the_run_by_its_code_on_each_event_also_once_the_run_is_deleted(
        self,
    ) -> None:
        code = self.run.code
        assert set(AuditEvent.objects.values_list("run_code", flat=True)) == {code}
        by_id = AuditEvent.objects.create(run_id=self.run.pk, actor="worker", action="run.x")
        assert by_id.run_code == code
        assert AuditEvent.objects.create(actor="alice", action="api_key.created").run_code is None
        for change in [
            lambda: AuditEvent.objects.filter(run=self.run).update(run_code=uuid.uuid4()),
            # The update a run's deletion makes, wiping the code as well.
            lambda: AuditEvent.objects.filter(run=self.run).update(run=None, run_code=None),
        ]:
            with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
                change()

        self.run.delete()  # still allowed: the SET NULL, and nothing else
        connection.check_constraints()
        assert list(AuditEvent.objects.filter(run_code=code).order_by("pk").values_list(
            "run", "action")) == [(None, "run.submitted"), (None, "run.approved"), (None, "run.x")]


def _project_apps(migration: str) -> Any:
    """The models as they were at ``sagas`` ``migration``, as a data migration sees them."""
    return MigrationExecutor(connection).loader.project_state(("sagas", migration)).apps


@pytest.mark.django_db(transaction=True)
def test_it_fills_in_the_run_code_of_the_events_made_before_it_was_kept() -> None:
    try:
        call_command("migrate", "sagas", "0012", verbosity=0)
        old = _project_apps("0012_metrics")
        run = old.get_model("sagas", "Run").objects.create(agent="checkout")
        gone = old.get_model("sagas", "Run").objects.create(agent="checkout")
        event = old.get_model("sagas", "AuditEvent").objects
        event.create(run=run, actor="alice", action="run.submitted")
        event.create(actor="alice", action="api_key.created")
        event.create(run=gone, actor="bob", action="run.submitted")
        gone.delete()  # before its code was kept: which run it was is lost
    finally:
        call_command("migrate", verbosity=0)  # every app to the latest, as other tests expect
    assert list(AuditEvent.objects.order_by("pk").values_list("action", "run_code")) == [
        ("run.submitted", run.code), ("api_key.created", None), ("run.submitted", None)]
    # The triggers are back on after the fill.
    with pytest.raises(IntegrityError, match="append-only"):
        AuditEvent.objects.update(run_code=None)


@pytest.mark.django_db(transaction=True)
def test_it_migrates_back_without_the_triggers_and_forward_with_them() -> None:
    event = AuditEvent.objects.create(actor="alice", action="run.submitted")
    try:
        call_command("migrate", "sagas", "0006", verbosity=0)
        AuditEvent.objects.filter(pk=event.pk).update(action="changed")  # no trigger left
    finally:
        # Every app, to the latest: leave the test database as the other tests expect it.
        call_command("migrate", verbosity=0)
    with pytest.raises(IntegrityError, match="append-only"):
        AuditEvent.objects.filter(pk=event.pk).update(action="changed again")
    assert AuditEvent.objects.get(pk=event.pk).action == "changed"
    # TRUNCATE is left open on purpose: Django's flush (after this test) empties tables with it.
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE sagas_auditevent")
    assert not AuditEvent.objects.exists()


# What each SQLite script (run by manage.py shell) starts with.
SQLITE_PRELUDE = """
import json, uuid
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from stateguard_web.sagas.models import AuditEvent, Run

def refused(change):
    try:
        with transaction.atomic():
            change()
    except IntegrityError as exc:
        return "append-only" in str(exc)
    return False
"""

SQLITE_SCRIPT = SQLITE_PRELUDE + """
call_command("migrate", verbosity=0)
run = Run.objects.create(agent="checkout")
event = AuditEvent.objects.create(run=run, actor="alice", action="run.submitted")
events = AuditEvent.objects.filter(pk=event.pk)
result = {
    "update": refused(lambda: events.update(action="x")),
    "delete": refused(lambda: events.delete()),
    "smuggled": refused(lambda: events.update(run=None, actor="mallory")),
}
run.delete()
result["kept"] = list(events.values_list("run", "actor", "action"))
call_command("migrate", "sagas", "0006", verbosity=0)
result["update_after_reverse"] = events.update(action="changed")
call_command("migrate", "sagas", verbosity=0)
result["update_after_forward"] = refused(lambda: events.update(action="x"))
print(json.dumps(result))
"""


def test_it_keeps_audit_events_append_only_on_sqlite(manage_py: ManagePy,
                                                      tmp_path: Path) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'audit.sqlite3'}", "DEBUG": "true"}
    result = manage_py("shell", "-c", SQLITE_SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "update": True, "delete": True, "smuggled": True,
        "kept": [[None, "alice", "run.submitted"]],
        "update_after_reverse": 1, "update_after_forward": True,
    }


SQLITE_RUN_CODE_SCRIPT = SQLITE_PRELUDE + """
call_command("migrate", "sagas", "0012", verbosity=0)
old = MigrationExecutor(connection).loader.project_state(("sagas", "0012_metrics")).apps
old_run = old.get_model("sagas", "Run").objects.create(agent="checkout")
old.get_model("sagas", "AuditEvent").objects.create(run=old_run, actor="alice", action="old")
call_command("migrate", verbosity=0)  # every app: 0012 took back those that need later sagas
result = {"filled": AuditEvent.objects.get(action="old").run_code == old_run.code}
run = Run.objects.create(agent="checkout")
AuditEvent.objects.create(run=run, actor="alice", action="new")
events = AuditEvent.objects.filter(run=run)
result["made"] = events.get().run_code == run.code
result["changed"] = refused(lambda: events.update(run_code=uuid.uuid4()))
result["wiped"] = refused(lambda: events.update(run=None, run_code=None))
run.delete()
result["kept"] = AuditEvent.objects.get(action="new").run_code == run.code
call_command("migrate", "sagas", "0012", verbosity=0)  # back: no column, 0007's trigger
with connection.cursor() as cursor:
    cursor.execute("PRAGMA table_info(sagas_auditevent)")
    columns = [row[1] for row in cursor.fetchall()]
result["back"] = "run_code" not in columns and refused(
    lambda: connection.cursor().execute("UPDATE sagas_auditevent SET action = 'x'"))
call_command("migrate", verbosity=0)
result["forward"] = refused(lambda: AuditEvent.objects.update(run_code=None))
print(json.dumps(result))
"""


def test_it_keeps_the_run_code_on_sqlite(manage_py: ManagePy, tmp_path: Path) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'audit.sqlite3'}", "DEBUG": "true"}
    result = manage_py("shell", "-c", SQLITE_RUN_CODE_SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "filled": True, "made": True, "changed": True, "wiped": True, "kept": True,
        "back": True, "forward": True,
    }


SQLITE_FLUSH_SCRIPT = SQLITE_PRELUDE + """
def triggers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"
                       " AND tbl_name = 'sagas_auditevent' ORDER BY name")
        return [name for (name,) in cursor.fetchall()]

call_command("migrate", verbosity=0)
run = Run.objects.create(agent="checkout")
AuditEvent.objects.create(run=run, actor="alice", action="run.submitted")
before = triggers()
call_command("flush", interactive=False, verbosity=0)
result = {"emptied": [Run.objects.count(), AuditEvent.objects.count()],
          "triggers_kept": triggers() == before and len(before) == 2}
event = AuditEvent.objects.create(actor="alice", action="run.submitted")
result["delete"] = refused(lambda: AuditEvent.objects.filter(pk=event.pk).delete())
print(json.dumps(result))
"""


def test_it_lets_flush_empty_a_sqlite_database_and_still_refuses_deletes(
    manage_py: ManagePy, sqlite_url: str
) -> None:
    # Django's flush on SQLite is DELETE FROM each table, which the trigger refuses row by row;
    # `make run`'s database is SQLite. (A migrated copy: the script's migrate has nothing to do.)
    env = {"DATABASE_URL": sqlite_url, "DEBUG": "true"}
    result = manage_py("shell", "-c", SQLITE_FLUSH_SCRIPT, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "emptied": [0, 0], "triggers_kept": True, "delete": True}
