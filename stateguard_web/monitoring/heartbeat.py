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

Each beat also says who the worker is, for the workers page (``GET /api/workers``): a hash
``stateguard:workers:info``, field = the same name, value = JSON (``WorkerInfo``: its host and
main pid, the pids of the processes that run its tasks, its concurrency and pool, and the code
version it runs). The pids are what a run's lease names (``host:pid:...``, the core's
``lease``), so the page can say which worker holds which run. A member dropped from the set
is dropped from the hash in the same script.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from celery import bootsteps

from stateguard_web.lib.redis_client import client
from stateguard_web.monitoring.version import code_version

__all__ = [
    "ALIVE_WITHIN",
    "FORGET_AFTER",
    "INFO_KEY",
    "INTERVAL",
    "KEY",
    "Alive",
    "HeartbeatStep",
    "Roster",
    "Seen",
    "WorkerInfo",
    "alive",
    "beat",
    "client",
    "forget",
    "roster",
    "worker_info",
]

logger = logging.getLogger("stateguard.heartbeat")

KEY = "stateguard:workers"
INFO_KEY = "stateguard:workers:info"  # name -> WorkerInfo as JSON
INTERVAL = 15.0  # seconds between beats
ALIVE_WITHIN = 60.0  # a worker heard from this recently counts as alive (four beats)
FORGET_AFTER = 86_400  # members silent this long are dropped (seconds)

# Both read the server's clock (TIME): Redis 5+ replicates a script's effects, not the script,
# so a script may call TIME before writing.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) end
local cut = now - tonumber(ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cut)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cut)
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
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
# -> {the queue's length, then name, seconds since its beat, info ("" if none) per worker}.
_ROSTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {redis.call('LLEN', KEYS[3])}
local seen = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #seen, 2 do
  out[#out + 1] = seen[i]
  out[#out + 1] = tostring(now - tonumber(seen[i + 1]))
  out[#out + 1] = redis.call('HGET', KEYS[2], seen[i]) or ''
end
return out
"""


@dataclass(frozen=True)
class WorkerInfo:
    """Who a worker is, as its beats say."""

    host: str = ""  # socket.gethostname(), as its leases name it
    pid: int | None = None  # the main process's
    pids: tuple[int, ...] = ()  # the processes that run its tasks (the main one too)
    concurrency: int | None = None
    pool: str = ""  # prefork, threads, solo...
    version: str = ""  # the code it runs (monitoring.version)
    started_at: float | None = None  # when it started (its own clock, seconds since 1970)

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "pids": list(self.pids),
                           "concurrency": self.concurrency, "pool": self.pool,
                           "version": self.version, "started_at": self.started_at})

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerInfo:
        """What a beat said; an empty one (a beat of older code, or none) for what is not
        there or not understood: the page says "unknown" rather than fail."""
        try:
            data = json.loads(text) if text else {}
            return cls(host=str(data.get("host") or ""), pid=_int(data.get("pid")),
                       pids=tuple(p for p in map(_int, data.get("pids") or ()) if p),
                       concurrency=_int(data.get("concurrency")),
                       pool=str(data.get("pool") or ""), version=str(data.get("version") or ""),
                       started_at=_float(data.get("started_at")))
        except (ValueError, TypeError, AttributeError):
            return cls()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def beat(r: redis.Redis, hostname: str, info: WorkerInfo | None = None) -> None:
    r.eval(_BEAT, 2, KEY, INFO_KEY, hostname, FORGET_AFTER, info.to_json() if info else "")


def forget(r: redis.Redis, hostname: str) -> None:
    pipe = r.pipeline(transaction=False)
    pipe.zrem(KEY, hostname)
    pipe.hdel(INFO_KEY, hostname)
    pipe.execute()


@dataclass(frozen=True)
class Alive:
    count: int  # workers heard from within ALIVE_WITHIN seconds
    last_beat_age: float | None  # seconds since any worker's latest beat; None: never


def alive(r: redis.Redis, within: float = ALIVE_WITHIN) -> Alive:
    count, age = r.eval(_ALIVE, 1, KEY, within)
    return Alive(int(count), float(age) if age not in (b"", "") else None)


@dataclass(frozen=True)
class Seen:
    """A worker heard from within the last day."""

    name: str  # its Celery hostname (name@host)
    age: float  # seconds since its latest beat
    info: WorkerInfo = field(default_factory=WorkerInfo)

    @property
    def alive(self) -> bool:
        return self.age <= ALIVE_WITHIN


@dataclass(frozen=True)
class Roster:
    queue_depth: int  # messages waiting in the queue
    workers: list[Seen]  # the most recently heard from first


def roster(r: redis.Redis, queue: str) -> Roster:
    """Every worker heard from within the last day, and the length of the broker's list
    ``queue`` (Celery's Redis transport keeps a queue's waiting messages in a list of that
    name: its monitoring guide counts them with ``LLEN``), in one script call."""
    depth, *rows = r.eval(_ROSTER, 3, KEY, INFO_KEY, queue)
    seen = [Seen(_text(rows[i]), float(rows[i + 1]), WorkerInfo.from_json(rows[i + 2]))
            for i in range(0, len(rows), 3)]
    return Roster(int(depth), sorted(seen, key=lambda s: (s.age, s.name)))


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def worker_info(c: Any) -> WorkerInfo:
    """This worker's ``WorkerInfo``, from its consumer: the pool's public ``info`` (what
    ``celery inspect stats`` shows) names its processes, which change as children are
    replaced, so each beat reads it again."""
    main = os.getpid()
    try:
        info = c.pool.info or {}
    except Exception:  # a pool that is starting or stopping: the main pid at least
        info = {}
    pids = tuple(dict.fromkeys([main, *(p for p in info.get("processes", ()) if p)]))
    concurrency = info.get("max-concurrency")
    return WorkerInfo(host=socket.gethostname(), pid=main, pids=pids,
                      concurrency=concurrency if isinstance(concurrency, int) else None,
                      pool=type(c.pool).__module__.rsplit(".", 1)[-1] if c.pool else "",
                      version=code_version(), started_at=_STARTED)


_STARTED = time.time()  # this process's start, near enough (the module loads at start-up)


class HeartbeatStep(bootsteps.StartStopStep):
    """Beats at start, then every ``INTERVAL`` seconds on the consumer's timer; forgets this
    worker when the consumer stops (a warm shutdown, or the broker connection lost)."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.tref: Any = None
        self.consumer: Any = None
        self.redis: redis.Redis | None = None

    def start(self, c: Any) -> None:
        self.consumer = c
        self.redis = client(c.app.conf.broker_url, timeout=2.0)
        self._beat(c.hostname)
        self.tref = c.timer.call_repeatedly(INTERVAL, self._beat, (c.hostname,))

    def _beat(self, hostname: str) -> None:
        assert self.redis is not None
        try:
            beat(self.redis, hostname, worker_info(self.consumer))
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
