"""Answer ``GET /healthz`` whatever the request's Host header says.

Health checks (a load balancer, a container runtime, a monitor on the host) reach Daphne by its
address: ``Host: 10.0.0.5:8000`` or ``127.0.0.1:8000``, not the site's name. With production's
``ALLOWED_HOSTS=stateguard.example.com`` Django refuses those with 400 DisallowedHost as soon as
a middleware asks for the host (SecurityMiddleware's HTTPS redirect, CommonMiddleware), so the
check reads "unhealthy" while the app is fine. This middleware comes before them and answers
``GET``/``HEAD /healthz`` itself with ``views.healthz`` (which reads nothing from the request but
asks the database), over plain HTTP too. Every other request, ``/healthz/`` and ``POST
/healthz`` included, goes through the whole stack, host validation included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

from stateguard_web import views

PATH = "/healthz"


def _is_health_check(request: HttpRequest) -> bool:
    return request.path_info == PATH and request.method in ("GET", "HEAD")


@sync_and_async_middleware
def healthz_middleware(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Sync and async, so that under Daphne the other requests take no thread hop here."""
    if iscoroutinefunction(get_response):
        async_get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = get_response

        async def async_middleware(request: HttpRequest) -> HttpResponseBase:
            if _is_health_check(request):
                return await sync_to_async(views.healthz)(request)  # the database is sync
            return await async_get_response(request)

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponseBase:
        if _is_health_check(request):
            return views.healthz(request)
        response: HttpResponseBase = get_response(request)
        return response

    return middleware
