"""The reads every API request makes, in plain SQL on PostgreSQL (an API key with its user and
permissions: ``accounts.selectors.api_key_find``; a run with its submitter and history:
``selectors.run_get(detail=True)``): read back as the ORM reads them, in one query, anew on
every call, and prepared by psycopg once a connection has run them a few times, as every query
of the ORM is (server-side binding, settings.py)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard_web.accounts import keycache, services
from stateguard_web.accounts import selectors as account_selectors
from stateguard_web.accounts.models import ApiKey
from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Run, Step
from tests.web.api.world import make_user

pytestmark = pytest.mark.django_db


def fields(obj: object) -> dict[str, object]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_it_reads_a_run_with_its_submitter_as_the_orm_does_in_one_query() -> None:
    alice = make_user("alice", "submitter")
    run = Run.objects.create(agent="checkout", input={"amount": 5, "note": "x"},
                             error={"type": "E", "message": "m"}, submitted_by=alice)
    with CaptureQueriesContext(connection) as queries:
        found = selectors.run_get(code=run.code, detail=True)
        assert found.submitted_by.get_username() == "alice"  # no second query
    assert len(queries) == 1
    orm = Run.objects.select_related("submitted_by").get(code=run.code)
    assert fields(found) == fields(orm)
    assert fields(found.submitted_by) == fields(orm.submitted_by)
    assert found.input == {"amount": 5, "note": "x"}  # JSON decoded, as the ORM does
    assert found.created_at.tzinfo is not None and found._state.adding is False
    assert found._state.db == "default"


def test_it_reads_a_run_nobody_submitted_and_each_call_anew() -> None:
    with pytest.raises(selectors.RunNotFound):
        selectors.run_get(code=uuid.uuid4(), detail=True)
    run = Run.objects.create(agent="checkout", input={})
    assert selectors.run_get(code=run.code, detail=True).submitted_by is None
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)
    assert selectors.run_get(code=run.code, detail=True).status == Run.Status.FAILED
    Step.objects.create(run=run, node="charge", step_id="s1", status=Step.Status.SUCCEEDED,
                        started_at=timezone.now())
    found = selectors.run_get(code=run.code, detail=True)
    assert [s["step_id"] for s in selectors.run_detail(run=found)["steps"]] == ["s1"]


def test_it_reads_a_key_with_its_user_and_permissions_as_the_orm_does() -> None:
    alice = make_user("alice", "submitter")
    key, _ = services.api_key_create(user=alice, name="ci",
                                     expires_at=timezone.now() + timedelta(days=1))
    alice.user_permissions.add(Permission.objects.get(codename="operate_run"))
    with CaptureQueriesContext(connection) as queries:
        found, perms = account_selectors.api_key_find(prefix=key.prefix)  # type: ignore[misc]
        assert found.user.get_username() == "alice"
    assert len(queries) == 1
    orm = ApiKey.objects.select_related("user").get(prefix=key.prefix)
    assert fields(found) == fields(orm) and fields(found.user) == fields(orm.user)
    assert perms is not None and sorted(perms) == sorted(
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.filter(group__user=alice) | alice.user_permissions.all())
    assert "sagas.operate_run" in perms  # its own, besides its role's
    assert account_selectors.api_key_find(prefix="sg_00000000") is None


def test_a_key_is_read_with_its_permissions_and_a_revocation_counts_at_once() -> None:
    alice = make_user("alice", "submitter")
    key, raw = services.api_key_create(user=alice, name="ci")
    with CaptureQueriesContext(connection) as queries:
        found = services.api_key_authenticate(raw, address=None)
        assert found.user.has_perm("sagas.submit_run")
        assert not found.user.has_perm("sagas.operate_run")
    assert len(queries) == 2  # the key with its permissions; its last use, once a minute
    # An UPDATE by hand sends no signal: the key cache is told (accounts/keycache.py).
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    keycache.changed()
    with pytest.raises(services.KeyRefused, match="revoked"):
        services.api_key_authenticate(raw, address=None)


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_it_prepares_what_a_connection_runs_again_and_again() -> None:
    """PostgreSQL then skips planning it: the plain SQL reads and the ORM's queries alike,
    whatever values they are given (the values travel apart from the text)."""
    alice = make_user("alice", "submitter")
    key, _ = services.api_key_create(user=alice, name="ci")
    run = Run.objects.create(agent="checkout", input={})
    threshold = settings.DATABASES["default"]["OPTIONS"]["prepare_threshold"]
    for _ in range(threshold + 1):
        selectors.run_get(code=run.code, detail=True)
        account_selectors.api_key_find(prefix=key.prefix)
        Run.objects.filter(code=uuid.uuid4()).exists()  # another value each time
    prepared = _prepared()
    assert any("json_build_object" in s for s in prepared)
    assert any("FROM accounts_apikey k" in s for s in prepared)
    assert any('FROM "sagas_run" WHERE "sagas_run"."code" = $' in s for s in prepared)
