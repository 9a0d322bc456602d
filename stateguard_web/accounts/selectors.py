"""Reads for accounts: an API key by its prefix, as every request with a key needs it, and a
user's saved views of the runs list."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import QuerySet

from stateguard_web.accounts.models import ApiKey, SavedView
from stateguard_web.lib import rows


@cache
def _key_sql() -> str:
    """The key by its prefix, its user, and the names (``app_label.codename``) of the user's
    permissions, its own and its groups' (``backends.granted``). Plain SQL, made once per
    process: the ORM built and compiled this query anew on each call at ~15 times the CPU of
    running it (P6, docs/benchmarks.md); its text the same on every call, psycopg prepares it."""
    user = get_user_model()
    own = user.user_permissions.through._meta.db_table
    member = user.groups.through._meta.db_table
    of_group = Group.permissions.through._meta.db_table
    return (
        f"SELECT {rows.columns(ApiKey, 'k')}, {rows.columns(user, 'u')}, "
        f"ARRAY(SELECT t.app_label || '.' || p.codename FROM {Permission._meta.db_table} p "
        f"JOIN {ContentType._meta.db_table} t ON t.id = p.content_type_id "
        f"WHERE p.id IN (SELECT permission_id FROM {own} WHERE user_id = k.user_id) "
        f"OR p.id IN (SELECT g.permission_id FROM {member} m "
        f"JOIN {of_group} g ON g.group_id = m.group_id WHERE m.user_id = k.user_id)) "
        f"FROM {ApiKey._meta.db_table} k JOIN {user._meta.db_table} u ON u.id = k.user_id "
        "WHERE k.prefix = %s")


def api_key_find(*, prefix: str) -> tuple[ApiKey, list[str] | None] | None:
    """The key ``prefix`` with its user, and (PostgreSQL) the user's permission names in the
    same query; None if there is no such key."""
    if connection.vendor != "postgresql":
        try:
            return ApiKey.objects.select_related("user").get(prefix=prefix), None
        except ApiKey.DoesNotExist:
            return None
    with connection.cursor() as cursor:
        cursor.execute(_key_sql(), [prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    (key, user), (perms,) = rows.read(row, ApiKey, get_user_model())
    key.user = user
    return key, perms


def saved_views(*, user: Any) -> QuerySet[SavedView]:
    """``user``'s saved views of the runs list, by name (none for an anonymous user)."""
    if not getattr(user, "is_authenticated", False):
        return SavedView.objects.none()
    return SavedView.objects.filter(user=user).order_by("name", "pk")
