"""The audit trail is append-only in the database (migration 0007), not only in the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
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


SQLITE_SCRIPT = """
import json
from django.core.management import call_command
from django.db import IntegrityError, transaction
from stateguard_web.sagas.models import AuditEvent, Run

def refused(change):
    try:
        with transaction.atomic():
            change()
    except IntegrityError as exc:
        return "append-only" in str(exc)
    return False

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
