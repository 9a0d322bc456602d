"""Project-level views (the apps have their own)."""

from __future__ import annotations

import logging
from functools import cache

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and `make run`: the process answers and the DB does too."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        logger.exception("healthz: database check failed")
        return JsonResponse({"ok": False, "error": "database unavailable"}, status=503)
    return JsonResponse({"ok": True})


@cache
def _favicon() -> bytes:
    return (settings.BASE_DIR / "static" / "favicon.ico").read_bytes()


@require_GET
@cache_control(public=True, max_age=86_400)
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask for on every page (the admin's and the API docs'
    too): served here so that a deployment whose proxy serves only /static/ has it as well,
    and no page leaves a 404 in the log."""
    return HttpResponse(_favicon(), content_type="image/x-icon")
