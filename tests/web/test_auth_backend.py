"""The authentication backend reads a user's permissions in one query, as Django's would."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.contrib.auth.models import Permission
from pytest_django import DjangoAssertNumQueries

from stateguard_web.accounts.backends import ModelBackend
from stateguard_web.accounts.services import role_grant


def _user(name: str, **fields: Any) -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create(username=name, **fields)


def _fresh(user: Any) -> Any:
    return type(user).objects.get(pk=user.pk)  # no permission cache


@pytest.mark.django_db
def test_it_reads_the_same_permissions_as_djangos_backend_in_one_query(
        django_assert_num_queries: DjangoAssertNumQueries) -> None:
    submitter = _user("submitter")
    role_grant(user=submitter, role="submitter")
    both = _user("both")  # a role, and a permission granted on its own
    role_grant(user=both, role="viewer")
    both.user_permissions.add(Permission.objects.get(codename="operate_run"))
    alone = _user("alone")
    alone.user_permissions.add(Permission.objects.get(codename="view_run"))
    users = [submitter, both, alone, _user("nobody"), _user("root", is_superuser=True),
             _user("gone", is_active=False)]
    role_grant(user=users[-1], role="operator")

    for user in users:
        expected = DjangoModelBackend().get_all_permissions(_fresh(user))
        fresh = _fresh(user)
        with django_assert_num_queries(0 if not user.is_active else 1):
            assert ModelBackend().get_all_permissions(fresh) == expected, user
        with django_assert_num_queries(0):  # cached on the user, as Django's backend does
            ModelBackend().get_all_permissions(fresh)
    assert ModelBackend().get_all_permissions(_fresh(both)) == {"sagas.view_run",
                                                                 "sagas.operate_run"}


@pytest.mark.django_db
def test_has_perm_asks_it(django_assert_num_queries: DjangoAssertNumQueries) -> None:
    user = _user("viewer")
    role_grant(user=user, role="viewer")
    user = _fresh(user)
    with django_assert_num_queries(1):
        assert user.has_perm("sagas.view_run") and not user.has_perm("sagas.operate_run")
