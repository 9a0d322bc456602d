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
``X-Frame-Options``, the API counter) runs with the view, in one call on the request's thread.
Every other request (a session's API calls with their CSRF check, the pages, a request with no
key) takes the site's whole ``MIDDLEWARE`` as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix
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
    """Django's ASGI handler with ``settings.KEYED_API_MIDDLEWARE`` as its middleware, and the
    whole of a request's Django part in one call on its thread.

    Django's handler crosses from the event loop to the request's thread (``sync_to_async``)
    for the ``request_started`` receivers, again for a sync view (the API's are: the ORM is
    sync), and again for ``response.close()`` (the ``request_finished`` receivers, which give
    the database connection back), and starts two tasks per request to notice a client that
    left. Each crossing wakes a thread and then the event loop: with the ORM's work done on
    the thread anyway, they were most of what an API request cost beyond its view (P6,
    docs/benchmarks.md). Here one call runs ``request_started``, the middleware (sync, as
    under WSGI), the view and, for a response that is not streamed, ``close()``; the event
    loop only reads the body and sends the answer. What is given up is Django's cancelling
    of an async view whose client left: these views are sync, and Django cannot stop a sync
    view either (it finishes on its thread, its answer dropped). Each middleware must be
    sync-capable and have no view, template-response or exception hooks (which this handler
    does not collect)."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response)
        for path in reversed(settings.KEYED_API_MIDDLEWARE):
            middleware = import_string(path)
            if not getattr(middleware, "sync_capable", True) or any(
                    hasattr(middleware, hook) for hook in (
                        "process_view", "process_template_response", "process_exception")):
                raise TypeError(f"KEYED_API_MIDDLEWARE: {path} must be sync-capable and have "
                                "no view, template-response or exception hook")
            handler = convert_exception_to_response(middleware(handler))
        self._middleware_chain = handler

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response, closing_failed = await sync_to_async(self._respond)(scope, body_file)
            await self.send_response(response, send)
            if closing_failed is not None:
                # As under Django's handler, whose close() comes after the answer: the client
                # gets the answer (a submission was stored), the error goes to the server.
                raise closing_failed
            if response.streaming:  # closed once its content is sent, as Django does
                await sync_to_async(response.close)()
        finally:
            body_file.close()

    def _respond(self, scope: dict[str, Any], body_file: Any
                 ) -> tuple[HttpResponseBase, Exception | None]:
        """What Django's ``handle`` does between reading the body and sending the answer, on
        the request's thread; and the error of closing the response, if any."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)  # the middleware, the view; logs 4xx/5xx
            response._handler_class = self.__class__  # type: ignore[attr-defined]
        assert response is not None
        if not response.streaming:
            try:
                response.close()  # request_finished: the connection goes back before sending
            except Exception as exc:  # a receiver failed
                return response, exc
        return response, None


class AnonymousUntilKeyed:
    """``request.user`` is anonymous until the key names its user (``api.auth.KeyAuth``): what
    Django's ``AuthenticationMiddleware`` would give a request without a session, without
    reading one."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request.user = AnonymousUser()
        return self.get_response(request)
