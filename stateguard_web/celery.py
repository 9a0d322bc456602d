"""The Celery app: ``celery -A stateguard_web worker`` / ``celery -A stateguard_web beat``.

Configuration comes from Django settings named ``CELERY_*`` (see settings.py), read through
Django's settings as Celery's Django guide does, so ``override_settings`` reaches Celery too;
tasks are found in each installed app's ``tasks`` module.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import task_prerun, worker_init, worker_process_init

from stateguard_web.lib.startup_gc import freeze_startup_objects
from stateguard_web.monitoring.heartbeat import HeartbeatStep

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stateguard_web.settings")

app = Celery("stateguard_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Each worker says it is alive in Redis every few seconds, for GET /api/health (heartbeat.py).
app.steps["consumer"].add(HeartbeatStep)


@worker_init.connect
def _keep_database_connections(**_: Any) -> None:
    """Keep each worker process's database connection between tasks.

    Otherwise every task connects again (Celery's Django fixup closes connections after each
    task, see CELERY_DB_REUSE_MAX): a new PostgreSQL backend per run, more CPU than the
    journal's own writes (P2, docs/benchmarks.md). A worker process runs one task at a time on
    one thread, so Django's caveat about persistent connections under ASGI does not apply."""
    from django.conf import settings
    from django.db import connections

    for alias in connections:
        db = connections[alias].settings_dict
        # The web processes' pool (DATABASE_POOL) is no use to a process that keeps one
        # connection, and Django refuses a pool with persistent connections.
        db.get("OPTIONS", {}).pop("pool", None)
        db["CONN_MAX_AGE"] = settings.WORKER_CONN_MAX_AGE
        db["CONN_HEALTH_CHECKS"] = True
        if connections[alias].vendor == "postgresql":  # names them in pg_stat_activity
            db.setdefault("OPTIONS", {}).setdefault("application_name", "stateguard-worker")
    task_prerun.connect(_drop_broken_or_old_connections, weak=False)


def _drop_broken_or_old_connections(**_: Any) -> None:
    """What Django does at the start of a request: a connection older than its max age goes,
    and (health checks) one the database dropped is replaced before the task uses it."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close_if_unusable_or_obsolete()


@worker_process_init.connect
def _freeze_what_the_process_started_with(**_: Any) -> None:
    """A pool process's garbage collected as it goes (``lib/startup_gc.py``)."""
    freeze_startup_objects()
