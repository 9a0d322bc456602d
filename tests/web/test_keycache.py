"""The per-process API key cache (accounts/keycache.py): a good key is read from PostgreSQL once,
then from the cache while the revision in Redis is unchanged; every change that can refuse a
key or change its user's permissions replaces the revision, so it counts from the next request
in every process. Another process is this one with its cached entries left in place: a change
reaches them only through the revision, as it reaches a web process the test never touched.
Over HTTP, in real servers' processes: tests/web/api/test_keyed_requests.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard_web.accounts import access, keycache, services, shared
from stateguard_web.accounts.access import Ability
from stateguard_web.accounts.models import ApiKey
from tests.web.api.world import make_user

pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.redis]


def queries_of(raw: str) -> tuple[ApiKey | Exception, int]:
    """What authenticating ``raw`` gives (the key, or the refusal) and its queries."""
    with CaptureQueriesContext(connection) as queries:
        try:
            found: ApiKey | Exception = services.api_key_authenticate(raw, address="192.0.2.1")
        except services.KeyRefused as exc:
            found = exc
    return found, len(queries)


@pytest.fixture
def alice() -> tuple[object, ApiKey, str]:
    user = make_user("alice", "submitter")
    key, raw = services.api_key_create(user=user, name="ci")
    services.api_key_authenticate(raw, address=None)  # read and kept; its first use written
    return user, key, raw


def test_a_good_key_asks_postgresql_nothing_once_read(alice: tuple[object, ApiKey, str]) -> None:
    _, key, raw = alice
    found, queries = queries_of(raw)
    assert queries == 0 and isinstance(found, ApiKey) and found.pk == key.pk
    assert access.may(found.user, Ability.SUBMIT)  # its permissions came along
    found.user.is_active = False  # a request's copy: the next one gets its own
    again, _ = queries_of(raw)
    assert isinstance(again, ApiKey) and again.user.is_active and again is not found


def test_a_revocation_elsewhere_counts_at_the_next_request(
        alice: tuple[object, ApiKey, str]) -> None:
    _, key, raw = alice
    services.api_key_revoke(key=key, by="carol")
    assert key.prefix in keycache._entries  # this process's entry is still there...
    found, queries = queries_of(raw)  # ...and the revision refuses it
    assert str(found) == "API key revoked" and queries == 1


def test_a_role_taken_or_given_counts_at_the_next_request(
        alice: tuple[object, ApiKey, str]) -> None:
    user, _, raw = alice
    user.groups.clear()  # type: ignore[attr-defined]
    found, _ = queries_of(raw)
    assert isinstance(found, ApiKey) and not access.may(found.user, Ability.SUBMIT)
    services.role_grant(user=user, role="operator")  # type: ignore[arg-type]
    found, _ = queries_of(raw)
    assert isinstance(found, ApiKey) and access.may(found.user, Ability.OPERATE)
    # A permission taken from the role's group, not from the user.
    Group.objects.get(name="operator").permissions.remove(
        Permission.objects.get(codename="operate_run"))
    found, _ = queries_of(raw)
    assert isinstance(found, ApiKey) and not access.may(found.user, Ability.OPERATE)


def test_a_user_deactivated_or_a_key_expired_by_hand_counts_at_the_next_request(
        alice: tuple[object, ApiKey, str]) -> None:
    user, key, raw = alice
    user.is_active = False  # type: ignore[attr-defined]
    user.save()  # type: ignore[attr-defined]
    assert str(queries_of(raw)[0]) == "the API key's user is inactive"
    user.is_active = True  # type: ignore[attr-defined]
    user.save()  # type: ignore[attr-defined]
    assert isinstance(queries_of(raw)[0], ApiKey)
    key.expires_at = timezone.now() - timedelta(seconds=1)
    key.save()  # the admin's change form
    assert str(queries_of(raw)[0]) == "API key expired"


def test_a_sign_in_replaces_nothing(alice: tuple[object, ApiKey, str]) -> None:
    user, _, raw = alice
    user.last_login = timezone.now()  # type: ignore[attr-defined]
    user.save(update_fields=["last_login"])  # type: ignore[attr-defined]
    assert queries_of(raw)[1] == 0


def test_with_no_revision_in_redis_it_reads_the_database_then_starts_one(
        alice: tuple[object, ApiKey, str]) -> None:
    _, key, raw = alice
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(keycache.REVISION_KEY)  # an emptied Redis
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())  # no signal either
    assert str(queries_of(raw)[0]) == "API key revoked"
    assert client.get(keycache.REVISION_KEY) is not None


def test_with_redis_down_it_reads_the_database_and_never_a_stale_key(
        alice: tuple[object, ApiKey, str], caplog: pytest.LogCaptureFixture) -> None:
    _, key, raw = alice
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        found, queries = queries_of(raw)
        assert isinstance(found, ApiKey) and queries == 1 and not keycache._entries
        services.api_key_revoke(key=key)  # the revision cannot be replaced now...
        assert str(queries_of(raw)[0]) == "API key revoked"
    assert "cached API keys are replaced when it is back" in caplog.text
    before = shared.client().get(keycache.REVISION_KEY)
    assert str(queries_of(raw)[0]) == "API key revoked"  # ...and is, at the next chance
    assert shared.client().get(keycache.REVISION_KEY) != before


@override_settings(STATEGUARD_API_KEY_CACHE_SECONDS=0)
def test_it_can_be_turned_off(alice: tuple[object, ApiKey, str]) -> None:
    assert queries_of(alice[2])[1] == 1


def test_an_entry_expires(alice: tuple[object, ApiKey, str]) -> None:
    _, key, raw = alice
    entry = keycache._entries[key.prefix]
    keycache._entries[key.prefix] = type(entry)(
        entry.revision, entry.key, entry.perms,
        entry.read_at - settings.STATEGUARD_API_KEY_CACHE_SECONDS)
    assert queries_of(raw)[1] == 1
