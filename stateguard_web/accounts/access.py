"""Who may do what to which run: the one place that says it.

The API asks it now; the dashboard and the admin ask it too. A principal is a user: an API key
acts with its user's permissions. Three abilities, each backed by a model permission (the
roles in ``roles`` are groups of them)::

    view     sagas.view_run or sagas.operate_run: every run
             sagas.submit_run alone: the runs the user submitted
    submit   sagas.submit_run
    operate  sagas.operate_run: approve, reject, retry, compensate, resolve, retry one
             compensation (of any run)
    refund   payments.refund_effect: refund a charge of the ledger by hand, verify the
             ledger with Stripe (the admin's actions; an operator's role has it)

Superusers may do everything; inactive and anonymous users nothing. ``check`` tells two
refusals apart: ``PermissionDenied`` when the user may not do this to any run (the API's 403),
``RunNotFound`` when it may not see this run (a 404, as for a run that does not exist: a
submitter learns nothing about other people's runs)::

    access.check(request.user, Ability.OPERATE, run)
    runs = access.visible_runs(request.user).filter(status="failed")
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet

from stateguard_web.runs.selectors import RunNotFound
from stateguard_web.sagas.models import Run

__all__ = ["Ability", "check", "may", "reads_all_runs", "visible_runs"]


class Ability(StrEnum):
    VIEW = "view"
    SUBMIT = "submit"
    OPERATE = "operate"
    REFUND = "refund"


def _active(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def _reads_all(user: Any) -> bool:
    return bool(user.has_perm("sagas.view_run") or user.has_perm("sagas.operate_run"))


def _reads_own(user: Any) -> bool:
    return bool(user.has_perm("sagas.submit_run"))


def reads_all_runs(user: Any) -> bool:
    """Whether ``user`` may see every run (a viewer, an operator, a superuser): what numbers
    about the whole journal need (GET /metrics), since they tell of everyone's runs."""
    return _active(user) and (user.is_superuser or _reads_all(user))


def visible_runs(user: Any) -> QuerySet[Run]:
    """The runs ``user`` may see."""
    if not _active(user):
        return Run.objects.none()
    if user.is_superuser or _reads_all(user):
        return Run.objects.all()
    if _reads_own(user):
        return Run.objects.filter(submitted_by=user)
    return Run.objects.none()


def may(user: Any, ability: Ability, run: Run | None = None) -> bool:
    """Whether ``user`` may ``ability`` to ``run``; without a run, to some run (may it see any
    run, submit at all, operate at all: whether to show a list, a form, a button)."""
    if not _active(user):
        return False
    if user.is_superuser:
        return True
    if ability == Ability.VIEW:
        if _reads_all(user):
            return True
        return _reads_own(user) and (run is None or run.submitted_by_id == user.pk)
    if ability == Ability.SUBMIT:
        return _reads_own(user)
    if ability == Ability.OPERATE:
        return bool(user.has_perm("sagas.operate_run"))
    if ability == Ability.REFUND:  # a string, not an import: payments uses accounts
        return bool(user.has_perm("payments.refund_effect"))
    raise ValueError(f"unknown ability {ability!r}")


def check(user: Any, ability: Ability, run: Run | None = None) -> None:
    """Refuse unless ``user`` may ``ability`` (to ``run``): ``PermissionDenied`` if it may not
    to any run, ``RunNotFound`` if it may not see ``run``."""
    if not may(user, ability):
        name = user.get_username() if _active(user) else "an anonymous user"
        raise PermissionDenied(f"{name} may not {ability} runs")
    if run is not None and not may(user, Ability.VIEW, run):
        raise RunNotFound(f"no run {run.code}")
    if run is not None and not may(user, ability, run):  # pragma: no cover - none today
        raise PermissionDenied(f"{user.get_username()} may not {ability} run {run.code}")
