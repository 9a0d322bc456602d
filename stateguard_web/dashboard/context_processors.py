"""The navigation's data on every page that extends ``base.html``: the user's role, the inbox
counts and whether any worker is alive (the banner). Lazy, so pages that never show the
navigation (the admin's) never query."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.dashboard import outbox, pages, workers


def _nav(user: Any) -> dict[str, Any]:
    sees_runs = access.may(user, Ability.VIEW)
    counts = pages.inbox_counts(user) if sees_runs else {"approvals": 0, "attention": 0}
    return {"role": pages.role_of(user), "sees_runs": sees_runs, "cap": pages.COUNT_CAP,
            "outbox": outbox.shown_to(user), "sees_workers": access.reads_all_runs(user),
            **counts}


def _poll_ms() -> int:
    return round(settings.STATEGUARD_WORKERS_POLL_SECONDS * 1000)


def navigation(user: Any) -> dict[str, Any]:
    """The navigation and the workers banner, read now (a live re-read's: dashboard/live.py)."""
    return {"nav": _nav(user), "workers": workers.worker_health(user),
            "workers_poll_ms": _poll_ms()}


def nav(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"nav": SimpleLazyObject(lambda: _nav(user)),
            "workers": SimpleLazyObject(lambda: workers.worker_health(user)),
            "workers_poll_ms": _poll_ms()}
