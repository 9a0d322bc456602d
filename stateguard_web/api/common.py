"""What the routers share: the error responses each operation declares, and the run an
operation acts on, found and authorized in one place."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import Principal, principal
from stateguard_web.api.errors import ErrorOut
from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Run


def errors(*codes: int) -> dict[int, Any]:
    """The error responses an operation may give, for the OpenAPI schema: a client, or a
    fuzzer, finds each status it can get documented. Every operation may give 401 and 403,
    413 (a body too large is refused before anything else, whatever the method), 429 (too
    many refused keys: accounts/throttle.py) and 500."""
    return {code: ErrorOut for code in sorted({401, 403, 413, 429, 500, *codes})}


def run_for(request: HttpRequest, code: uuid.UUID, ability: Ability,
            detail: bool = False) -> tuple[Principal, Run]:
    """The caller and the run ``code`` if the caller may ``ability`` to it: 403 if it may
    not to any run, 404 if there is no such run or it may not see it. With ``detail``, the run
    is read with what ``selectors.run_detail`` shows of it."""
    who = principal(request)
    access.check(who.user, ability)
    run = selectors.run_get(code=code, detail=detail)
    access.check(who.user, ability, run)
    return who, run
