"""Answer ``GET /healthz`` whatever the request's Host header says.

Health checks (a load balancer, a container runtime, a monitor on the host) reach Daphne by its
address: ``Host: 10.0.0.5:8000`` or ``127.0.0.1:8000``, not the site's name. With production's
``ALLOWED_HOSTS=stateguard.example.com`` Django refuses those with 400 DisallowedHost as soon as
a middleware asks for the host (SecurityMiddleware's HTTPS redirect, CommonMiddleware), so the
check reads "unhealthy" while the app is fine. This middleware comes before them and answers
``GET``/``HEAD /healthz`` itself with ``healthz`` (which reads nothing from the request but
asks the database), over plain HTTP too. Every other request, ``/healthz/`` and ``POST
/healthz`` included, goes through the whole stack, host validation included.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.utils.decorators import sync_and_async_middleware

PATH = "/healthz"
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


def _is_health_check(request: HttpRequest) -> bool:
    return request.path_info == PATH and request.method in ("GET", "HEAD")


@sync_and_async_middleware
def healthz_middleware(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Sync and async, so that under Daphne the other requests take no thread hop here."""
    if iscoroutinefunction(get_response):
        async_get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = get_response

        async def async_middleware(request: HttpRequest) -> HttpResponseBase:
            if _is_health_check(request):
                return await sync_to_async(healthz)(request)  # the database is sync
            return await async_get_response(request)

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponseBase:
        if _is_health_check(request):
            return healthz(request)
        response: HttpResponseBase = get_response(request)
        return response

    return middleware
