"""/api/compensations: retry one compensation that failed, was skipped in doubt, or waits."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Path, Router, Status

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import MAX_ID, RunOut
from stateguard_web.runs import selectors, services

router = Router(tags=["compensations"])


@router.post("/{id}/retry", response={202: RunOut, **errors(404, 409, 422)},
             summary="Retry one compensation")
def retry_compensation(request: HttpRequest,
                       id: int = Path(..., ge=1, le=MAX_ID)) -> Status[dict[str, object]]:
    """Run it again with new attempts and the same idempotency key (a worker does); 409
    unless it failed or was skipped in doubt (on a run that needs attention) or waits to be
    tried again (on a compensating run: it is tried now instead)."""
    who = principal(request)
    access.check(who.user, Ability.OPERATE)
    compensation = selectors.compensation_get(pk=id)
    access.check(who.user, Ability.OPERATE, compensation.run)
    services.compensation_retry(compensation=compensation, by=who.actor)
    return Status(202, selectors.run_summary(
        run=selectors.run_get(code=compensation.run.code)))
