"""/api/incidents: failed and needs-attention runs grouped by agent, step and error type, as
the dashboard's Incidents page shows them (``runs/incidents.py``)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import IncidentFilter, IncidentListOut
from stateguard_web.runs import incidents

router = Router(tags=["incidents"])


@router.get("", response={200: IncidentListOut, **errors(422)}, summary="List incidents")
def list_incidents(request: HttpRequest, filters: Query[IncidentFilter]) -> dict[str, object]:
    """The runs the caller may see that failed or need attention, grouped by agent, status,
    the step they failed at and their error's type: how many, when the first and the latest
    got there, the latest one's error message, and how many got there in each part of the
    window. Each group's ``filter`` is GET /api/runs's for its runs, and a batch's (POST
    /api/batches with ``filter``) to act on them all."""
    who = principal(request)
    access.check(who.user, Ability.VIEW)
    page = incidents.incident_groups(runs=access.visible_runs(who.user), window=filters.window,
                                     agent=filters.agent, status=filters.status,
                                     sort=filters.sort, limit=filters.limit)
    return incidents.page_json(page)
