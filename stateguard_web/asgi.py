"""ASGI entry point: ``daphne stateguard_web.asgi:application``.

HTTP goes to Django (API requests that carry a key through a leaner middleware stack,
``api.asgi``); websockets go through the origin check and the session/auth middleware to
``routing.websocket_urlpatterns``.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")

# Set Django up before importing anything that may import models (consumers, routing).
django.setup(set_prefix=False)  # as get_asgi_application() does; the handler is ours:

from stateguard_web import twisted_http  # noqa: E402
from stateguard_web.threads import ReusedThreadsHandler  # noqa: E402

twisted_http.install()  # Daphne's HTTP: a header too long answered (431), Content-Type parses kept
django_asgi_app = ReusedThreadsHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from stateguard_web.api.asgi import ByCredentials, KeyedApiHandler  # noqa: E402
from stateguard_web.dashboard.origin import SameOriginValidator  # noqa: E402
from stateguard_web.routing import websocket_urlpatterns  # noqa: E402

# Under plain `daphne` (make run) nothing else serves static files, so in DEBUG do what
# `runserver` does. In production a proxy serves STATIC_ROOT (docs/deploy.md).
site_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app
# API requests with a key take a handler without the session, CSRF and message middleware
# (stateguard_web/api/asgi.py); everything else, API calls with a session included, the site's.
http_app = ByCredentials(site=site_app, keyed=KeyedApiHandler())

application = ProtocolTypeRouter(
    {
        "http": http_app,
        # Browsers send the session cookie with a websocket opened by any site, and websockets
        # have no CSRF check: without this, a page elsewhere could read a logged-in operator's
        # live run updates. Only the site's own origin (scheme, host and port) and the
        # CSRF_TRUSTED_ORIGINS may connect, and none without one (dashboard/origin.py).
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
