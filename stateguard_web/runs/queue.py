"""The broker's queue that runs wait in: how many messages wait there now.

Celery's Redis transport keeps a queue's waiting messages in a list named as the queue
(Celery's monitoring guide counts them with ``LLEN``); messages a worker has taken and not yet
acknowledged are not in it. One call, bounded by a short timeout: the sweeper asks every few
seconds, and a page must not hang on a Redis that does not answer.

``send_on_commit`` queues a task once the rows commit; a broker that is down then is logged,
not raised (the sweeper sends a run's start or an operator's request again).
"""

from __future__ import annotations

import functools
import logging
from functools import cache
from typing import Any

import redis
from celery import Task, current_app
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError

from stateguard_web.lib.redis_client import client

logger = logging.getLogger("stateguard.tasks")
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


def send_on_commit(task: Task, *args: Any, lost: str = "the sweeper queues it once it finds "
                   "no message for it") -> None:
    """``task.delay(*args)`` once the caller's transaction commits, never raising out of it.

    A broker that cannot be reached then (a Redis restarting) is logged, with ``lost`` (what
    becomes of the task), not raised: the rows are committed, so the request that stored them
    succeeded, and answering it with an error would have the client submit again what is
    already stored; in a worker, the error would reach the saga's own code. Celery's
    ``delay_on_commit`` raises out of the commit instead (a 500 for a stored run). The default
    ``lost`` is for the tasks the sweeper queues again when their message is missing
    (``tasks.sweep_expired_leases``)."""
    transaction.on_commit(functools.partial(send, task, args, lost))


def send(task: Task, args: tuple[Any, ...], lost: str) -> None:
    """``task.apply_async(args)``; a broker out of reach is logged (``send_on_commit``)."""
    try:
        task.apply_async(args)
    except OperationalError as exc:  # kombu's, once its publish retries are spent
        logger.warning("%s%r not queued, the broker is unreachable (%s); %s", task.name, args,
                       exc, lost)
