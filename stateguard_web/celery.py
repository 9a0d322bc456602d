"""The Celery app: ``celery -A stateguard_web worker`` / ``celery -A stateguard_web beat``.

Configuration comes from Django settings named ``CELERY_*`` (see settings.py); tasks are found
in each installed app's ``tasks`` module.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")

app = Celery("stateguard_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
