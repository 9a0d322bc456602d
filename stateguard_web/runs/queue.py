"""The broker's queue that runs wait in: how many messages wait there now.

Celery's Redis transport keeps a queue's waiting messages in a list named as the queue
(Celery's monitoring guide counts them with ``LLEN``); messages a worker has taken and not yet
acknowledged are not in it. One call, bounded by a short timeout: the sweeper asks every few
seconds, and a page must not hang on a Redis that does not answer.
"""

from __future__ import annotations

from functools import cache

import redis
from celery import current_app
from django.conf import settings

from stateguard_web.lib.redis_client import client

TIMEOUT = 1.0  # seconds


def name() -> str:
    """The queue runs are sent to: Celery's default (no task is routed elsewhere)."""
    return str(current_app.conf.task_default_queue)


@cache  # one connection pool per broker URL, kept by the process
def _redis(url: str) -> redis.Redis:
    return client(url, timeout=TIMEOUT)


def depth() -> int:
    """Messages waiting in the queue; ``redis.RedisError`` if the broker does not answer."""
    return int(_redis(settings.CELERY_BROKER_URL).llen(name()))
