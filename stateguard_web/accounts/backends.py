"""The authentication backend: Django's ``ModelBackend``, with a user's permissions read in one
query instead of two.

Every API request asks whether its user may do what it asks (``access``), which reads the user's
permissions once per request: Django reads those granted to the user and those of its groups
(the roles) in two queries. Here one query reads both, into the same per-user cache that
``ModelBackend`` keeps (``_perm_cache``), so ``has_perm`` and the admin answer as before. A query
that reads a user may read its permissions along with it (``remember_permissions``): an API
key's lookup does (``selectors.api_key_find``), so a request with a key asks once.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.contrib.auth.models import Group, Permission
from django.db.models import Q, QuerySet


def granted(user_id: int) -> QuerySet[Permission]:
    """The permissions given to the user ``user_id``: its own and its groups'."""
    own = get_user_model().user_permissions.through.objects.filter(user_id=user_id)
    of_groups = Group.permissions.through.objects.filter(group__user=user_id)
    return Permission.objects.filter(Q(pk__in=own.values("permission_id"))
                                     | Q(pk__in=of_groups.values("permission_id"))).order_by()


def remember_permissions(user_obj: Any, names: list[str] | None) -> None:
    """Give ``user_obj`` the permissions a query read along with it (``app_label.codename``),
    so that ``has_perm`` asks nothing more. A superuser's are left to be read if asked (they
    are every permission, not what was granted)."""
    if names is not None and user_obj.is_active and not user_obj.is_superuser:
        user_obj._perm_cache = set(names)


class ModelBackend(DjangoModelBackend):
    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            perms = Permission.objects.all() if user_obj.is_superuser else granted(user_obj.pk)
            user_obj._perm_cache = {
                f"{app_label}.{codename}" for app_label, codename
                in perms.values_list("content_type__app_label", "codename").order_by()}
        return user_obj._perm_cache  # type: ignore[no-any-return]
