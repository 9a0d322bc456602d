"""CompiledGet (stateguard_web/precompiled.py): the API's hottest lookups, compiled once, read
back exactly as the ORM reads them, and fresh on every call (nothing but the SQL is kept)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard_web.accounts import services
from stateguard_web.accounts.models import ApiKey
from stateguard_web.precompiled import CompiledGet
from stateguard_web.sagas import selectors
from stateguard_web.sagas.models import Run, Step
from tests.web.api.world import make_user

pytestmark = pytest.mark.django_db


def test_it_reads_a_run_as_the_orm_does_with_its_submitter_in_one_query() -> None:
    alice = make_user("alice", "submitter")
    run = Run.objects.create(agent="checkout", input={"amount": 5, "note": "x"},
                             submitted_by=alice)
    compiled = CompiledGet(selectors._run_by_code, marker=uuid.UUID(int=0))
    with CaptureQueriesContext(connection) as queries:
        found = compiled.get(run.code)
        assert found.submitted_by.get_username() == "alice"  # no second query
    assert len(queries) == 1
    orm = selectors._run_by_code(run.code).get()
    fields = [f.attname for f in Run._meta.concrete_fields]
    assert [getattr(found, f) for f in fields] == [getattr(orm, f) for f in fields]
    assert found.input == {"amount": 5, "note": "x"}  # JSON decoded, as the ORM does
    assert found.created_at.tzinfo is not None and found._state.adding is False


def test_it_raises_does_not_exist_and_reads_each_call_anew() -> None:
    compiled = CompiledGet(selectors._run_by_code, marker=uuid.UUID(int=0))
    with pytest.raises(Run.DoesNotExist):
        compiled.get(uuid.uuid4())
    run = Run.objects.create(agent="checkout", input={})
    assert compiled.get(run.code).status == Run.Status.PENDING
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)
    assert compiled.get(run.code).status == Run.Status.FAILED


def test_it_refuses_a_marker_that_is_not_one_parameter() -> None:
    compiled = CompiledGet(lambda agent: Run.objects.filter(agent=agent, status=agent),
                           marker="m")
    with pytest.raises(AssertionError, match="marker"):
        compiled.get("checkout")


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_it_is_prepared_at_its_first_use_however_many_queries_the_connection_makes() -> None:
    """PostgreSQL then skips planning it. Django's own queries are never prepared, and
    hundreds of them between two lookups do not keep it from being prepared."""
    run = Run.objects.create(agent="checkout", input={})
    assert selectors.run_get(code=run.code, detail=True).pk == run.pk
    for _ in range(120):
        Run.objects.filter(code=uuid.uuid4()).exists()  # a new statement text each
    assert selectors.run_get(code=run.code, detail=True).pk == run.pk
    prepared = _prepared()
    assert len(prepared) == 1 and '"detail_history"' in prepared[0]


@pytest.mark.django_db(transaction=True)
def test_a_migration_that_changes_a_column_it_reads_does_not_break_it() -> None:
    """PostgreSQL refuses a prepared statement whose result type changed ("cached plan must
    not change result type"); psycopg would keep it, and every later lookup on this pooled
    connection would fail. The lookup drops the prepared statements and runs again."""
    run = Run.objects.create(agent="checkout", input={})
    assert selectors.run_get(code=run.code, detail=True).agent == "checkout"
    assert _prepared()
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("prepare_threshold", None)
    other = psycopg.connect(**params, autocommit=True)  # as a migration from elsewhere would
    try:
        other.execute("ALTER TABLE sagas_run ALTER COLUMN agent TYPE varchar(150)")
        for _ in range(3):
            assert selectors.run_get(code=run.code, detail=True).agent == "checkout"
    finally:
        other.execute("ALTER TABLE sagas_run ALTER COLUMN agent TYPE varchar(100)")
        other.close()
    assert selectors.run_get(code=run.code, detail=True).agent == "checkout"


def test_a_run_detail_reads_its_history_with_the_run() -> None:
    run = Run.objects.create(agent="checkout", input={})
    now = timezone.now()
    for i, node in enumerate(("charge", "book")):
        Step.objects.create(run=run, node=node, step_id=f"s{i}", status=Step.Status.SUCCEEDED,
                            started_at=now + timedelta(seconds=i))
    with CaptureQueriesContext(connection) as queries:
        found = selectors.run_get(code=str(run.code), detail=True)
    assert len(queries) == 1
    assert [s["node"] for s in found.detail_history["steps"]] == ["charge", "book"]
    assert selectors.run_detail(run=found)["steps"] == selectors.run_detail(
        run=Run.objects.get(pk=run.pk))["steps"]


def test_a_key_is_read_with_its_permissions_and_a_revocation_counts_at_once() -> None:
    alice = make_user("alice", "submitter")
    key, raw = services.api_key_create(user=alice, name="ci")
    with CaptureQueriesContext(connection) as queries:
        found = services.api_key_authenticate(raw, address=None)
        assert found.user.has_perm("sagas.submit_run")
        assert not found.user.has_perm("sagas.operate_run")
    assert len(queries) == 2  # the key with its permissions; its last use, once a minute
    assert found.user._perm_cache == {
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.filter(group__user=alice)}
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    with pytest.raises(services.KeyRefused, match="revoked"):
        services.api_key_authenticate(raw, address=None)


def test_it_converts_a_long_statement_for_the_server_once_per_process(monkeypatch) -> None:
    """psycopg parses the placeholders of statements over 4 kB (the run's history) on every
    execute; run_prepared's statements keep their conversion, and still read right."""
    import psycopg._queries

    from stateguard_web import precompiled

    calls: list[bytes] = []
    real = psycopg._queries._query2pg_nocache

    def counted(query: bytes, encoding: str):  # type: ignore[no-untyped-def]
        calls.append(query)
        return real(query, encoding)

    monkeypatch.setattr(precompiled, "_query2pg_nocache", counted)
    monkeypatch.setattr(precompiled._KeptConversion, "_kept", {})
    run = Run.objects.create(agent="checkout", input={"amount": 5})
    Step.objects.create(run=run, step_id="charge", node="charge", status="succeeded",
                        started_at=timezone.now())
    sql = selectors._RUN_DETAIL.plan.sql
    assert len(sql) > 4096 or len(selectors._RUN_DETAIL.plan.params) > 50  # past psycopg's cache
    for _ in range(3):
        found = selectors.run_get(code=run.code, detail=True)
        assert [s["step_id"] for s in selectors.run_detail(run=found)["steps"]] == ["charge"]
    assert len(calls) == 1
    with pytest.raises(Run.DoesNotExist):
        selectors._RUN_DETAIL.get(uuid.uuid4())  # another value, the same conversion
    assert len(calls) == 1
