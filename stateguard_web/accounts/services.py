"""Writes for accounts: API keys (make, check, revoke), service users in a role, and each
user's saved views of the runs list.

Errors: ``KeyRefused`` (the key is unknown, revoked or expired, or its user inactive; the
API's 401), ``throttle.Throttled`` (too many failed keys from the address, or wrong secrets
for the key: the API's 429), ``UnknownRole`` and ``TooManyViews``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from stateguard_web.accounts import keycache, throttle
from stateguard_web.accounts.backends import remember_permissions
from stateguard_web.accounts.models import ApiKey, SavedView
from stateguard_web.accounts.roles import ROLES, Role
from stateguard_web.sagas.models import AuditEvent

__all__ = ["KEY_PREFIX", "MAX_SAVED_VIEWS", "KeyRefused", "TooManyViews", "UnknownRole",
           "api_key_authenticate", "api_key_create", "api_key_issue", "api_key_revoke",
           "role_grant", "saved_view_delete", "saved_view_save", "service_user_ensure"]

KEY_PREFIX = "sg_"
_PREFIX_LENGTH = len(KEY_PREFIX) + 8  # "sg_" and 8 hex digits: sg_1a2b3c4d
_KEY_SHAPE = re.compile(r"sg_[0-9a-f]{8}_[A-Za-z0-9_-]{1,100}")
# A key's last use is written at most this often: one UPDATE per key per minute, not one per
# request (an agent polling a run would otherwise write on every poll).
LAST_USED_RESOLUTION = timedelta(minutes=1)
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


class KeyRefused(Exception):
    """The presented key does not authenticate anyone (the message says why)."""


class UnknownRole(ValueError):
    pass


class TooManyViews(ValueError):
    """The user has ``MAX_SAVED_VIEWS`` saved views already (the message says so)."""


# A menu a person reads: past this many, one is deleted before another is saved.
MAX_SAVED_VIEWS = 50


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def _actor(by: AbstractBaseUser | str | None) -> str:
    if by is None:
        return "system"
    return str(by.get_username()) if isinstance(by, AbstractBaseUser) else str(by)


@transaction.atomic
def api_key_issue(*, key: ApiKey, by: AbstractBaseUser | str | None = None) -> str:
    """Give an unsaved ``key`` (its user, name, expiry set) a secret, store it and return the
    whole key: the only time it is known. The admin's "add" comes here."""
    for _ in range(5):  # a prefix is 32 random bits: a clash is rare, and retried
        prefix = KEY_PREFIX + secrets.token_hex(4)
        raw = f"{prefix}_{secrets.token_urlsafe(32)}"
        key.prefix, key.hashed = prefix, _hash(raw)
        try:
            with transaction.atomic():
                key.save()
        except IntegrityError:
            if ApiKey.objects.filter(prefix=prefix).exists():
                continue
            raise
        AuditEvent.objects.create(actor=_actor(by), action="api_key.created",
                                  data={"prefix": key.prefix, "name": key.name,
                                        "user": str(key.user.get_username())})
        return raw
    raise RuntimeError("could not find a free API key prefix")  # pragma: no cover


def api_key_create(*, user: AbstractBaseUser, name: str, expires_at: datetime | None = None,
                   by: AbstractBaseUser | str | None = None) -> tuple[ApiKey, str]:
    """A new key for ``user``: the stored row and the whole key (shown once, never stored)."""
    key = ApiKey(user=user, name=name, expires_at=expires_at)
    return key, api_key_issue(key=key, by=by)


def api_key_revoke(*, key: ApiKey, by: AbstractBaseUser | str | None = None) -> bool:
    """Revoke ``key`` from now on; False if it was revoked already."""
    with transaction.atomic():
        revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now())
        if revoked:
            AuditEvent.objects.create(actor=_actor(by), action="api_key.revoked",
                                      data={"prefix": key.prefix, "name": key.name})
            keycache.changed()  # an UPDATE sends no signal
    key.refresh_from_db(fields=["revoked_at"])
    return bool(revoked)


def api_key_authenticate(raw: str, *, address: str | None) -> ApiKey:
    """The active key ``raw`` is, with its user; ``KeyRefused`` otherwise.

    The key, its user and (on PostgreSQL) the user's permissions, which ``has_perm`` then
    answers from, come from this process's cache (``keycache``) or one query: a revoked key,
    an expired one, an inactive user or a permission taken away counts from the next request
    on, in every process. The secret is compared in constant time. Whether a key was revoked
    or expired is said only to whoever presents the whole key (a wrong secret gets the same
    answer as no key at all).

    ``address`` is the client's (``throttle.client_address``): a refused key counts against it
    and, when the key exists, against the key; ``throttle.Throttled`` once either is locked
    out (see the throttle's docstring for which keys that refuses). None for a caller that is
    no client (a shell), whose failures nothing counts."""
    prefix = raw[:_PREFIX_LENGTH]
    by_address, by_key = ([], []) if address is None else throttle.api_key_counters(
        address=address, prefix=prefix)
    # One Redis round trip for both lock-outs and the key cache's revision: what throttling
    # and the cache's invalidation cost a good key.
    lock, read = throttle.read(by_address + by_key, keycache.REVISION_KEY)
    if lock is not None and lock.counter in by_address:
        raise lock
    key, perms = None, None
    if _KEY_SHAPE.fullmatch(raw):  # nothing else reaches the database
        key, perms = keycache.find(prefix=prefix, revision=read[0] if read else None,
                                   reachable=read is not None) or (None, None)
    # Compare a hash even when no key has this prefix, so that both take the same time.
    if not hmac.compare_digest(_hash(raw), key.hashed if key else _DUMMY_HASH) or key is None:
        started = throttle.fail(by_address + (by_key if key is not None else []),
                                action="api_key.locked_out",
                                data={"address": address, **({"key": prefix} if key else {})})
        # A lock-out on the key refuses its wrong secrets only.
        raise started or lock or KeyRefused("invalid API key")
    # The whole key was presented: no guess, so nothing below is counted.
    if key.revoked_at is not None:
        raise KeyRefused("API key revoked")
    if key.expired:
        raise KeyRefused("API key expired")
    if not key.user.is_active:
        raise KeyRefused("the API key's user is inactive")
    remember_permissions(key.user, perms)
    now = timezone.now()
    if key.last_used_at is None or key.last_used_at < now - LAST_USED_RESOLUTION:
        # Conditional, so that of the requests that saw a stale value only one writes.
        ApiKey.objects.filter(Q(last_used_at__isnull=True)
                              | Q(last_used_at__lt=now - LAST_USED_RESOLUTION),
                              pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
        keycache.used(prefix=prefix, at=now)
    return key


def _role_group(role: Role) -> Group:
    """The role's group, as migration 0002 made it; made again if it is gone (a database
    emptied by ``flush`` keeps its permissions, which post_migrate makes, but not its groups).
    A site's changes to an existing group's permissions are left alone."""
    group, created = Group.objects.get_or_create(name=role)
    if created:
        for perm in ROLES[role]:
            app_label, codename = perm.split(".")
            group.permissions.add(Permission.objects.get(content_type__app_label=app_label,
                                                         codename=codename))
    return group


@transaction.atomic
def role_grant(*, user: AbstractBaseUser, role: Role | str) -> bool:
    """Put ``user`` in ``role``'s group; False if it was there already."""
    try:
        group = _role_group(Role(role))
    except ValueError:
        raise UnknownRole(f"no role {role!r}; roles are {', '.join(Role)}") from None
    if user.groups.filter(pk=group.pk).exists():  # type: ignore[attr-defined]
        return False
    user.groups.add(group)  # type: ignore[attr-defined]
    return True


@transaction.atomic
def service_user_ensure(*, username: str, role: Role | str) -> tuple[AbstractBaseUser, bool]:
    """The user ``username`` (made, with no password, if missing) in ``role``; and whether it
    was made. A service account is an ordinary user: it logs in with its API keys only."""
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    role_grant(user=user, role=role)
    return user, created


@transaction.atomic
def saved_view_save(*, user: AbstractBaseUser, name: str, query: str) -> SavedView:
    """Save the runs list ``query`` as ``user``'s view ``name``, or give the view of that
    name this query. ``TooManyViews`` past ``MAX_SAVED_VIEWS``."""
    # The user's row locked: two saves at once cannot both pass the count.
    get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
    view = SavedView.objects.filter(user=user, name=name).first()
    if view is None:
        if SavedView.objects.filter(user=user).count() >= MAX_SAVED_VIEWS:
            raise TooManyViews(f"You have {MAX_SAVED_VIEWS} saved views: delete one first.")
        return SavedView.objects.create(user=user, name=name, query=query)
    view.query = query
    view.save(update_fields=["query"])
    return view


def saved_view_delete(*, user: AbstractBaseUser, pk: int) -> SavedView | None:
    """Delete ``user``'s view ``pk``; None if they have no such view (another's included)."""
    view = SavedView.objects.filter(user=user, pk=pk).first()
    if view is not None:
        view.delete()
    return view
