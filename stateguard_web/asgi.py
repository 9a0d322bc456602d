"""ASGI entry point: ``daphne stateguard_web.asgi:application``.

In production Daphne serves the websockets only (the proxy sends ``/ws/`` to it and the rest to
gunicorn, ``wsgi.py``; docs/deploy.md); under ``make run`` one Daphne serves both. HTTP goes to
Django's own ASGI handler with the site's whole ``MIDDLEWARE``, as under WSGI; websockets go
through the origin check and the session/auth middleware to ``routing.websocket_urlpatterns``.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")

# Set Django up before importing anything that may import models (consumers, routing).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from stateguard_web import twisted_http  # noqa: E402
from stateguard_web.dashboard.origin import SameOriginValidator  # noqa: E402
from stateguard_web.routing import websocket_urlpatterns  # noqa: E402

twisted_http.install()  # Daphne's HTTP: a header line too long is answered (431), not dropped

# Under plain `daphne` (make run) nothing else serves static files, so in DEBUG do what
# `runserver` does. In production a proxy serves STATIC_ROOT (docs/deploy.md).
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

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
