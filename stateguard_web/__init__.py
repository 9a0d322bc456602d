"""StateGuard's Django project: settings, URLs, WSGI, ASGI and Celery apps, and its own apps."""

from __future__ import annotations

# Load the Celery app whenever Django starts, so @shared_task binds to it.
from stateguard_web.celery import app as celery_app

__all__ = ["celery_app"]
