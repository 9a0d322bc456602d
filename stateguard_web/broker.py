"""The Celery broker's transport: kombu's Redis transport, with one Redis client per channel.

Selected by ``CELERY_BROKER_TRANSPORT`` (settings.py) for a plain ``redis://`` broker URL; the
URL, queues and messages are kombu's own. kombu's Redis channel builds a new ``redis.Redis``
client for every command it sends outside its consumer's client, each publish included
(``Channel.conn_or_acquire()`` calls ``Channel._create_client()``), and redis-py fills ~165
response callbacks into each new client: ~0.1 ms of CPU per publish (a fifth of what was left
of it; "Celery publish per submission" in docs/benchmarks.md). A client is only a handle on the
channel's connection pool (it borrows a connection per command, and redis-py clients may be
shared between threads), so this channel keeps the one it made, and makes another when the
channel replaces its pool (after a fork, or a reconnect). Side effect: the worker's banner
names the broker ``stateguard_web.broker:Transport://host:port/db`` instead of ``redis://...``.

It also tells ``sagas.queueing`` what it handed Redis last on this thread (``last_put``): the
message a submission's first ``run_execute`` publish made, which later ones reuse.

This relies on kombu internals, checked by tests/web/test_celery_app.py:
``kombu.transport.redis.Channel.conn_or_acquire(client=None)`` (a context manager that yields
the given client or one of the channel's), ``Channel._create_client()``, ``Channel.pool``,
``Channel._put(queue, message)`` and ``Channel._q_for_pri``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from kombu.transport import redis


class Put(NamedTuple):
    channel: Channel
    queue: str
    message: dict[str, Any]  # as kombu made it, before its JSON encoding

    @property
    def key(self) -> str:
        """The Redis list the message went to (kombu's, for its priority)."""
        channel = self.channel
        return str(channel._q_for_pri(self.queue, channel._get_message_priority(
            self.message, reverse=False)))


_puts = threading.local()


def last_put() -> Put | None:
    """The message this thread's last publish through a ``Channel`` handed Redis alone (not in
    a batch, nor with an expiring queue); None if there is none."""
    return getattr(_puts, "last", None)


class Channel(redis.Channel):
    _own_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        own = self._own_client
        if own is None or own.connection_pool is not self.pool:
            own = self._own_client = self._create_client()
        yield own

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        plain = "_publish_batch" not in kwargs and not (self._expires and queue in self._expires)
        super()._put(queue, message, **kwargs)
        _puts.last = Put(self, queue, message) if plain else None


class Transport(redis.Transport):
    Channel = Channel
