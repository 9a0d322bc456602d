"""The leaner way in for API requests that carry a key: ``Authorization: Bearer ...`` under
``/api/``.

Such a request is judged by its key alone (``api.auth``): no session is read, no CSRF token is
asked for (a browser never sends an Authorization header on its own) and no message is shown.
Yet the site's middleware ran Django's session, CSRF, authentication and message middleware on
it all the same, and under ASGI each of their hooks is a thread hop (``sync_to_async``): 13
hooks, ~1.2-1.5 ms of a ~10 ms API request (P6, docs/benchmarks.md).

So ``asgi.application`` sends these requests to a Django handler of their own
(``KeyedApiHandler``) whose middleware is ``settings.KEYED_API_MIDDLEWARE``: the site's
``MIDDLEWARE`` without the session, CSRF, authentication and message middleware (a test keeps
the two lists in step). What is left (the HTTPS redirect and security headers, host validation,
``X-Frame-Options``) is Django's own middleware, run on the event loop (``OnTheLoop``): their
hooks only read the request and set headers, so they need no thread. Every other request (a
session's API calls with their CSRF check, the pages, a request with no key) takes the site's
whole ``MIDDLEWARE`` as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.middleware import clickjacking, common, security
from django.utils.module_loading import import_string

from stateguard_web.metrics import API_PREFIX
from stateguard_web.threads import ReusedThreadsHandler

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def carries_key(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` is an HTTP request under /api/ that ``api.auth.KeyAuth`` judges by
    its key alone: its (first) Authorization header is ``Bearer ...``, as Django reads it."""
    if scope["type"] != "http":
        return False
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    if not path.startswith(API_PREFIX):
        return False
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":  # Django joins repeated headers: the first leads
            return bool(value[:7].lower() == b"bearer ")
    return False


class ByCredentials:
    """HTTP requests that carry a key go to ``keyed``, every other one to ``site``."""

    def __init__(self, site: ASGIApp, keyed: ASGIApp) -> None:
        self.site, self.keyed = site, keyed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        app = self.keyed if carries_key(scope) else self.site
        await app(scope, receive, send)


class KeyedApiHandler(ReusedThreadsHandler):
    """Django's ASGI handler with ``settings.KEYED_API_MIDDLEWARE`` as its middleware. Each
    must be async (no thread hop) and have no view, template-response or exception hooks
    (which this handler does not collect)."""

    def load_middleware(self, is_async: bool = False) -> None:
        assert is_async, "ASGI only"
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response_async)
        for path in reversed(settings.KEYED_API_MIDDLEWARE):
            middleware = import_string(path)
            if not getattr(middleware, "async_capable", False) or any(
                    hasattr(middleware, hook) for hook in (
                        "process_view", "process_template_response", "process_exception")):
                raise TypeError(f"KEYED_API_MIDDLEWARE: {path} must be async and have no "
                                "view, template-response or exception hook")
            handler = convert_exception_to_response(middleware(handler))
        self._middleware_chain = handler


class OnTheLoop:
    """A Django ``MiddlewareMixin`` whose hooks run on the event loop, not in a thread: only for
    middleware whose ``process_request``/``process_response`` do no I/O (they read the request
    and settings and set headers). Its hooks are called in the same order, with the same
    short-circuit, as ``MiddlewareMixin`` does."""

    sync_capable = False
    async_capable = True
    get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]

    def __call__(self, request: HttpRequest) -> Awaitable[HttpResponseBase]:
        return self._on_the_loop(request)

    async def _on_the_loop(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(OnTheLoop, security.SecurityMiddleware):
    """The HTTPS redirect and the security headers (HSTS, nosniff, referrer, COOP)."""


class CommonMiddleware(OnTheLoop, common.CommonMiddleware):
    """Host validation (``ALLOWED_HOSTS``), disallowed user agents, ``APPEND_SLASH``."""


class XFrameOptionsMiddleware(OnTheLoop, clickjacking.XFrameOptionsMiddleware):
    """``X-Frame-Options``."""


class AnonymousUntilKeyed:
    """``request.user`` is anonymous until the key names its user (``api.auth.KeyAuth``): what
    Django's ``AuthenticationMiddleware`` would give a request without a session, without
    reading one."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]
                 ) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request.user = AnonymousUser()
        return await self.get_response(request)
