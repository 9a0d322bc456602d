"""The Redis that every web process shares for the accounts' state: the throttle's counts and
lock-outs (``throttle``) and the API key cache's revision (``keycache``).

One redis-py client per process, built on first use from ``settings.REDIS_URL`` and kept: its
connection pool is thread-safe, so the request threads share it. Django's cache did this work
before, at ~4 times the CPU of the Redis call itself on a keyed request (a ``redis.Redis``
built per call, values pickled; P6, docs/benchmarks.md). Values here are plain strings.

Short timeouts: a hung Redis must not hang a request (callers then act as if nothing were
stored: the throttle lets it through, the key cache reads the database; each logs why).
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

__all__ = ["KEY_PREFIX", "client"]

# Every key of ours starts with it: the Redis database is shared with Celery's queue and the
# channel layer, so nothing of ours ever empties the database.
KEY_PREFIX = "stateguard:"

_client: redis.Redis | None = None
_making = threading.Lock()


def client() -> redis.Redis:
    """This process's client of the shared Redis (answers decoded to ``str``)."""
    global _client
    made = _client
    if made is None:
        with _making:  # request threads may ask at the same time: one pool, not several
            if _client is None:
                _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1,
                                               socket_timeout=1, decode_responses=True)
            made = _client
    return made


@receiver(setting_changed)
def _forget_client(*, setting: str, **kwargs: Any) -> None:
    """A test that points ``REDIS_URL`` elsewhere (``override_settings``) gets a client of
    that Redis, and the one before back afterwards."""
    global _client
    if setting == "REDIS_URL" and _client is not None:
        old, _client = _client, None
        old.close()
