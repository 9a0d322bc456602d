"""The websockets' Origin check: the rule Django's CSRF check applies to a form's POST.

A browser sends the operator's session cookie with a websocket that a page of any site opens,
and a websocket carries no CSRF token, so the handshake is refused (HTTP 403) unless its one
``Origin`` header is

- the site's own: the scheme, host and port of the websocket request itself, whose ``Host``
  is in ``ALLOWED_HOSTS``; the scheme is ``https`` when the connection is secure (``wss``, or
  ``SECURE_PROXY_SSL_HEADER`` says a TLS proxy is in front), else ``http``; or
- one of ``CSRF_TRUSTED_ORIGINS`` (``https://*.example.com`` for its subdomains), for pages
  served under another name than the one the request reaches Daphne with.

The port counts: ``http://127.0.0.1:9999`` is not ``http://127.0.0.1:8000``; it is another
program on the operator's machine. Channels' ``AllowedHostsOriginValidator``, used before,
compared the host alone.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain

Scope = dict[str, Any]


class SameOriginValidator:
    """ASGI middleware: lets a websocket through to ``application`` only from an allowed
    origin (above); denies the handshake otherwise."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> Any:
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


def origin_allowed(scope: Scope) -> bool:
    origins = [value for name, value in scope.get("headers", ()) if name == b"origin"]
    if len(origins) != 1:  # none (not a browser's page), or a request that is not one's
        return False
    origin = origins[0].decode("latin1")
    return origin == _own_origin(scope) or _trusted(origin)


def _own_origin(scope: Scope) -> str | None:
    """``scheme://host[:port]`` of the request, as Django reads it for an HTTP request (the
    same ``ALLOWED_HOSTS``, ``USE_X_FORWARDED_HOST`` and ``SECURE_PROXY_SSL_HEADER``); None
    when its host is not allowed or it names none."""
    request = HttpRequest()
    request.META = {"HTTP_" + name.decode("latin1").upper().replace("-", "_"):
                    value.decode("latin1") for name, value in scope.get("headers", ())}
    if "HTTP_HOST" not in request.META:
        return None
    try:
        host = request.get_host()
    except DisallowedHost:
        return None
    secure = scope.get("scheme") == "wss" or request.is_secure()
    return f"{'https' if secure else 'http'}://{host}"


def _trusted(origin: str) -> bool:
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    return any(is_same_domain(parsed.netloc, urlsplit(trusted).netloc.lstrip("*"))
               for trusted in settings.CSRF_TRUSTED_ORIGINS
               if "*" in trusted and urlsplit(trusted).scheme == parsed.scheme)
