"""The broker's queue that runs wait in: how many messages wait there now.

Celery's Redis transport keeps a queue's waiting messages in a list named as the queue
(Celery's monitoring guide counts them with ``LLEN``); messages a worker has taken and not yet
acknowledged are not in it. One call, bounded by a short timeout: the sweeper asks every few
seconds, and a page must not hang on a Redis that does not answer.

``send_on_commit`` queues a task whose message the sweeper sends again when it is lost (a run
to start, an operator's request): a broker that is down when the rows commit is logged, not
raised.
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


def send_on_commit(task: Task, *args: Any) -> None:
    """``task.delay(*args)`` once the caller's transaction commits, for a task the sweeper
    queues again when its message is missing (``tasks.sweep_expired_leases``).

    A broker that cannot be reached then (a Redis restarting) is logged, not raised: the rows
    are committed, so the request that stored them succeeded, and answering it with an error
    would have the client submit again what is already stored. Celery's own
    ``delay_on_commit`` raises out of the commit instead (a 500 for a stored run)."""
    transaction.on_commit(functools.partial(send, task, args))


def send(task: Task, args: tuple[Any, ...]) -> None:
    """``task.apply_async(args)``; a broker out of reach is logged (``send_on_commit``)."""
    try:
        task.apply_async(args)
    except OperationalError as exc:  # kombu's, once its publish retries are spent
        logger.warning("%s%r not queued, the broker is unreachable (%s); the sweeper queues it "
                       "once it finds no message for it", task.name, args, exc)
