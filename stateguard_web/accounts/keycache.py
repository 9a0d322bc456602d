"""A per-process cache of API keys: the key's row, its user and the user's permissions, so
that a request with a good key asks PostgreSQL nothing (P6, docs/benchmarks.md).

Invalidation: one revision in the shared Redis (``REVISION_KEY``, a random token) stands for
everything a key's check reads. Each entry remembers the revision it was read under and is
used only while the revision is unchanged; the revision is read in the same round trip as the
throttle's lock-outs (``throttle.read``), so a good key costs one Redis round trip. Every
change that can refuse a key or change what its user may do replaces the revision, after
its transaction commits, in every process: a key revoked (``services.api_key_revoke``) or
saved (its expiry edited), a user saved (deactivated) or deleted, a user's groups or
permissions changed, a group's permissions changed, a group, permission or content type
renamed or deleted (the signal receivers below). So such a change counts from the next
request on, in every process, as it did when every request read the database.

Order makes it safe: an entry takes the revision read *before* its database read, and a
change replaces the revision *after* it commits, so an entry read before a change commits
has a revision the change replaced. When the revision is missing (a new or emptied Redis),
nothing is cached until it is set again (here, at once); when Redis cannot be reached, every
entry is dropped and the database is read, as before this cache. A change that could not
replace the revision (Redis down at the time) replaces it at the next chance in its own
process; meanwhile other processes' entries still expire after
``STATEGUARD_API_KEY_CACHE_SECONDS`` (0 turns the cache off).

Not seen: writes that send no signal (``QuerySet.update()`` of users or keys, SQL by hand).
After one, call ``changed()``. Expiry needs nothing: it is checked on every request.
"""

from __future__ import annotations

import copy
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from stateguard_web.accounts import selectors, shared
from stateguard_web.accounts.models import ApiKey

__all__ = ["REVISION_KEY", "changed", "connect_signals", "find", "forget_all", "used"]

logger = logging.getLogger(__name__)

REVISION_KEY = f"{shared.KEY_PREFIX}accounts:revision"
# Keys are few (one per client program); the bound only keeps a flood of distinct good keys
# from growing the process. Unknown prefixes are never kept.
_MAX_ENTRIES = 1024


@dataclass(frozen=True, slots=True)
class _Entry:
    revision: str
    key: ApiKey  # with its user; never handed out, only copies of it
    perms: tuple[str, ...] | None
    read_at: float  # time.monotonic()


_entries: dict[str, _Entry] = {}
_owed = threading.Event()  # a change could not replace the revision: replace it at next chance


def find(*, prefix: str, revision: str | None, reachable: bool
         ) -> tuple[ApiKey, list[str] | None] | None:
    """``selectors.api_key_find(prefix=prefix)``, from this process's cache when ``revision``
    (``REVISION_KEY``'s value, read in this request's round trip; None if missing) is the one
    the entry was read under. ``reachable``: whether that read reached Redis. The key and its
    user are this request's own copies."""
    seconds = settings.STATEGUARD_API_KEY_CACHE_SECONDS
    if not reachable:
        forget_all()  # changes made meanwhile could not say so
        return selectors.api_key_find(prefix=prefix)
    if _owed.is_set():
        _replace()
        return selectors.api_key_find(prefix=prefix)  # the revision read is the old one
    if revision is None or not seconds:
        if revision is None and seconds:
            _start()
        return selectors.api_key_find(prefix=prefix)
    now = time.monotonic()
    entry = _entries.get(prefix)
    if entry is None or entry.revision != revision or now - entry.read_at >= seconds:
        found = selectors.api_key_find(prefix=prefix)
        if found is None:
            _entries.pop(prefix, None)
            return None
        key, perms = found
        if len(_entries) >= _MAX_ENTRIES:
            _entries.pop(next(iter(_entries), ""), None)  # the oldest read
        entry = _Entry(revision, _copy(key), None if perms is None else tuple(perms), now)
        _entries[prefix] = entry
        return key, perms
    return _copy(entry.key), None if entry.perms is None else list(entry.perms)


def used(*, prefix: str, at: Any) -> None:
    """The key ``prefix``'s last use was written as ``at``: its cached row says so too, or
    every request would find it stale and write it again."""
    entry = _entries.get(prefix)
    if entry is not None:
        entry.key.last_used_at = at


def changed() -> None:
    """Every process's cached keys are stale: replace the revision now, and again once the
    current transaction commits (the one that matters: a process that read the revision now
    may still read the rows from before the commit). The first also serves a transaction
    that never commits in a test (``TestCase``)."""
    _replace()
    transaction.on_commit(_replace)


def forget_all() -> None:
    _entries.clear()


def _replace() -> None:
    try:
        shared.client().set(REVISION_KEY, secrets.token_hex(8))
    except redis.RedisError as error:
        _owed.set()
        # The error's words, not its traceback: `make run` migrates before its Redis is up,
        # and each permission migrate saves would print one.
        logger.warning("key cache: Redis is unreachable (%s); cached API keys are replaced "
                       "when it is back", error)
    else:
        _owed.clear()


def _start() -> None:
    """A revision where there is none: entries are kept from the next request on (not this
    one's: a change may have committed between this request's read and now)."""
    try:
        shared.client().set(REVISION_KEY, secrets.token_hex(8), nx=True)
    except redis.RedisError as error:
        logger.warning("key cache: Redis is unreachable (%s)", error)


def _copy(key: ApiKey) -> ApiKey:
    """A copy of ``key`` and its user (Django's pickling support: the instance's state and
    field cache copied too): a request may change its own (``_perm_cache``, ``last_used_at``)
    without touching another's."""
    clone = copy.copy(key)
    clone.user = copy.copy(key.user)
    return clone


# --- what changes a key's check ------------------------------------------------------------

def _on_key_saved(*, created: bool, **kwargs: Any) -> None:
    if not created:  # a new key is in no cache yet
        changed()


def _on_user_saved(*, created: bool, update_fields: Any = None, **kwargs: Any) -> None:
    # A sign-in saves last_login only, which no key's check reads.
    if not created and set(update_fields or ()) != {"last_login"}:
        changed()


def _on_saved(*, created: bool, **kwargs: Any) -> None:
    if not created:  # renamed: a permission's name is app_label.codename
        changed()


def _on_deleted(**kwargs: Any) -> None:
    changed()


def _on_m2m(*, action: str, **kwargs: Any) -> None:
    if action.startswith("post_"):
        changed()


def connect_signals() -> None:
    """Connect the receivers (``AccountsConfig.ready``: the user model is known by then)."""
    user = get_user_model()
    post_save.connect(_on_key_saved, sender=ApiKey, dispatch_uid="keycache.key")
    post_save.connect(_on_user_saved, sender=user, dispatch_uid="keycache.user")
    for model in (Permission, ContentType):
        post_save.connect(_on_saved, sender=model, dispatch_uid=f"keycache.{model.__name__}")
    for model in (ApiKey, user, Group, Permission, ContentType):
        post_delete.connect(_on_deleted, sender=model,
                            dispatch_uid=f"keycache.del.{model.__name__}")
    for through in (user.groups.through, user.user_permissions.through,  # type: ignore[attr-defined]
                    Group.permissions.through):
        m2m_changed.connect(_on_m2m, sender=through,
                            dispatch_uid=f"keycache.m2m.{through.__name__}")
