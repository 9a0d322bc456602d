"""A Redis client for questions that must be answered quickly or not at all."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def client(url: str, *, timeout: float) -> redis.Redis:
    """A Redis client that gives up after ``timeout`` seconds and never retries: a health
    check, a beat or a page that waits longer than that is worth less than a fast "no"."""
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                retry=Retry(NoBackoff(), 0), health_check_interval=0)
