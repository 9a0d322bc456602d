"""The authentication backend: Django's ``ModelBackend``, with a user's permissions read in one
query instead of two.

Every API request asks whether its user may do what it asks (``access``), which reads the user's
permissions once per request: Django reads those granted to the user and those of its groups
(the roles) in two queries. Here one query reads both, into the same per-user cache that
``ModelBackend`` keeps (``_perm_cache``), so ``has_perm`` and the admin answer as before.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend as DjangoModelBackend
from django.contrib.auth.models import Group, Permission
from django.db.models import Q


class ModelBackend(DjangoModelBackend):
    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            if user_obj.is_superuser:
                perms = Permission.objects.all()
            else:
                granted = user_obj.user_permissions.through.objects.filter(user_id=user_obj.pk)
                of_groups = Group.permissions.through.objects.filter(
                    group__user=user_obj.pk)
                perms = Permission.objects.filter(
                    Q(pk__in=granted.values("permission_id"))
                    | Q(pk__in=of_groups.values("permission_id")))
            user_obj._perm_cache = {
                f"{app_label}.{codename}" for app_label, codename
                in perms.values_list("content_type__app_label", "codename").order_by()}
        return user_obj._perm_cache  # type: ignore[no-any-return]
