"""A Content-Security-Policy header on every response: ``settings.SECURE_CSP``.

The policy lets a page load scripts, styles, images and fonts from this site only, connect
back to it only (its fetches and websockets), post forms to it only, and be framed by no one.
So an injected ``<script>`` or ``onclick=`` runs nowhere. The pages we serve (the dashboard,
Django's admin, the API docs) keep no inline script or style for it: dashboard.js reads the
page's ``data-`` attributes. The browser test fails on any violation Chromium reports.

``SECURE_CSP`` has the shape of Django 6.0's setting of that name (directive -> sources):
moving to Django's own middleware is a change of ``MIDDLEWARE`` only. A view that sets its
own header keeps it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

HEADER = "Content-Security-Policy"


def policy(directives: dict[str, list[str]]) -> str:
    return "; ".join(" ".join([name, *sources]) for name, sources in directives.items())


@sync_and_async_middleware
def csp_middleware(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Sync and async, so that under Daphne it adds no thread hop (as healthz_middleware)."""
    header = policy(settings.SECURE_CSP)

    if iscoroutinefunction(get_response):
        async_get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]] = get_response

        async def async_middleware(request: HttpRequest) -> HttpResponseBase:
            response = await async_get_response(request)
            response.headers.setdefault(HEADER, header)
            return response

        return async_middleware

    def middleware(request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = get_response(request)
        response.headers.setdefault(HEADER, header)
        return response

    return middleware

