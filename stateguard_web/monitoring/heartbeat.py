"""Worker heartbeats in Redis: every worker says "alive" every ``INTERVAL`` seconds, and
``GET /api/health`` counts the workers heard from in the last ``ALIVE_WITHIN`` seconds.

One sorted set in the broker's Redis, ``stateguard:workers``: member = the worker's Celery
hostname (``name@host``), score = the Redis server's clock at its latest beat. The server's
clock, not the hosts': a web host whose clock is a minute off would otherwise call every worker
dead. Health reads it with one script call (``ZCOUNT`` over the last minute), whatever the
number of keys in that Redis (the queues, the channel layer's): no ``SCAN``, no Celery
broadcast waiting for replies. A worker that stops cleanly removes itself; one that dies
stops beating and falls out of the count a minute later. Each beat drops members silent for a
day, so the set holds the workers of about the last day and no more.

The beat is a bootstep of the worker's consumer (``HeartbeatStep``, added in
``stateguard_web.celery``), on the consumer's timer: it beats while the worker's main process
runs its event loop and is connected to the broker, which is what "alive" should mean. Each
call is bounded by a 2 s socket timeout, so a Redis that hangs delays the loop at most that
long (and then the worker's own broker connection is in trouble anyway).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import redis
from celery import bootsteps
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger("stateguard.heartbeat")

KEY = "stateguard:workers"
INTERVAL = 15.0  # seconds between beats
ALIVE_WITHIN = 60.0  # a worker heard from this recently counts as alive (four beats)
FORGET_AFTER = 86_400  # members silent this long are dropped (seconds)

# Both read the server's clock (TIME): Redis 5+ replicates a script's effects, not the script,
# so a script may call TIME before writing.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
# -> {alive count, seconds since the newest beat ("" if none)}; floats leave Lua as strings.
_ALIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local alive = redis.call('ZCOUNT', KEYS[1], now - tonumber(ARGV[1]), '+inf')
local newest = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local age = ''
if newest[2] then age = tostring(now - tonumber(newest[2])) end
return {alive, age}
"""


def client(url: str, *, timeout: float) -> redis.Redis:
    """A Redis client that gives up after ``timeout`` seconds and never retries: a health
    check or a beat that waits longer than that is worth less than a fast "no"."""
    return redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                retry=Retry(NoBackoff(), 0), health_check_interval=0)


def beat(r: redis.Redis, hostname: str) -> None:
    r.eval(_BEAT, 1, KEY, hostname, FORGET_AFTER)


def forget(r: redis.Redis, hostname: str) -> None:
    r.zrem(KEY, hostname)


@dataclass(frozen=True)
class Alive:
    count: int  # workers heard from within ALIVE_WITHIN seconds
    last_beat_age: float | None  # seconds since any worker's latest beat; None: never


def alive(r: redis.Redis, within: float = ALIVE_WITHIN) -> Alive:
    count, age = r.eval(_ALIVE, 1, KEY, within)
    return Alive(int(count), float(age) if age not in (b"", "") else None)


class HeartbeatStep(bootsteps.StartStopStep):
    """Beats at start, then every ``INTERVAL`` seconds on the consumer's timer; forgets this
    worker when the consumer stops (a warm shutdown, or the broker connection lost)."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.tref: Any = None
        self.redis: redis.Redis | None = None

    def start(self, c: Any) -> None:
        self.redis = client(c.app.conf.broker_url, timeout=2.0)
        self._beat(c.hostname)
        self.tref = c.timer.call_repeatedly(INTERVAL, self._beat, (c.hostname,))

    def _beat(self, hostname: str) -> None:
        assert self.redis is not None
        try:
            beat(self.redis, hostname)
        except redis.RedisError as exc:  # health will say so; the next beat may get through
            logger.warning("worker heartbeat to Redis failed: %s", exc)

    def stop(self, c: Any) -> None:
        if self.tref is not None:
            c.timer.cancel(self.tref)
            self.tref = None
        if self.redis is not None:
            # If this fails it falls out of the count within ALIVE_WITHIN seconds anyway.
            with contextlib.suppress(redis.RedisError):
                forget(self.redis, c.hostname)
            self.redis.close()
            self.redis = None

    shutdown = stop
