"""WSGI entry point: production serves HTTP with ``gunicorn`` (``gunicorn.conf.py`` names this
application), Daphne the websockets (``asgi.py``); docs/deploy.md.

Django's own handler and the site's whole ``MIDDLEWARE``, for every request: pages, API calls
with a session and API calls with a key alike.
"""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")

application = get_wsgi_application()
