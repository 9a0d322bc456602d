"""The Celery app's configuration (stateguard_web/celery.py, settings.py) and its broker transport
(stateguard_web/broker.py): what keeps a submission's publish cheap, and what that relies on.

That a submitted run is still picked up and run by a real worker is tested end to end in
tests/web/api/test_end_to_end.py (over HTTP) and tests/web/test_workers.py.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from kombu.transport import redis as kombu_redis

from stateguard_web import broker
from stateguard_web.celery import app
from stateguard_web.sagas import tasks


def on_new_threads(*calls: Callable[[], Any]) -> list[Any]:
    """Each call on a thread of its own, as Daphne runs each request; their results."""
    results: list[Any] = []
    for call in calls:
        thread = threading.Thread(target=lambda call=call: results.append(call()))
        thread.start()
        thread.join()
    return results


def test_it_gives_celery_every_celery_setting() -> None:
    names = [name for name in dir(settings) if name.startswith("CELERY_")]
    assert "CELERY_DB_REUSE_MAX" in names  # read by Celery's Django fixup under this name
    for name in names:
        assert app.conf.get(name) == getattr(settings, name), name
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert app.conf.task_acks_late is True
    assert app.conf.beat_schedule == settings.CELERY_BEAT_SCHEDULE


def test_it_keeps_one_result_backend_for_all_threads() -> None:
    # Without a result backend, Celery would build a disabled one on each thread that publishes.
    first, second = on_new_threads(lambda: app.backend, lambda: app.backend)
    assert first is second
    assert type(first).__name__ == "DisabledBackend"


def test_it_publishes_a_run_from_new_threads_through_one_redis_client(
        queue: redis.Redis) -> None:
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    clients = on_new_threads(*[lambda pk=pk: _publish_and_get_client(pk) for pk in (7, 8)])

    assert isinstance(clients[0], redis.Redis)
    assert clients[0] is clients[1]  # kombu's channel would make one per publish
    messages = [json.loads(m) for m in queue.lrange("celery", 0, -1)][::-1]  # LPUSH: newest first
    assert [(m["headers"]["task"], m["headers"]["argsrepr"],
             m["properties"]["delivery_info"]["routing_key"]) for m in messages] == [
        ("stateguard_web.sagas.tasks.run_execute", "(7,)", "celery"),
        ("stateguard_web.sagas.tasks.run_execute", "(8,)", "celery"),
    ]


def _publish_and_get_client(pk: int) -> Any:
    tasks.run_execute.delay(pk)
    with app.producer_or_acquire() as producer:
        assert isinstance(producer.channel, broker.Channel)
        return producer.channel._own_client


def test_it_finds_the_kombu_internals_its_broker_transport_relies_on() -> None:
    # broker.Channel overrides conn_or_acquire(client=None) and calls _create_client() and
    # pool: if kombu renames them, the override silently stops applying (or breaks).
    assert issubclass(broker.Channel, kombu_redis.Channel)
    own = inspect.signature(kombu_redis.Channel.conn_or_acquire).parameters
    assert list(own) == ["self", "client"]
    assert list(inspect.signature(kombu_redis.Channel._create_client).parameters) == [
        "self", "asynchronous"]
    assert isinstance(inspect.getattr_static(kombu_redis.Channel, "pool"), property)
    assert broker.Transport.Channel is broker.Channel
    # broker.Channel._put reports each message (sagas/queueing.py) with the list it went to.
    assert list(inspect.signature(kombu_redis.Channel._put).parameters) == [
        "self", "queue", "message", "kwargs"]
    assert list(inspect.signature(kombu_redis.Channel._q_for_pri).parameters) == [
        "self", "queue", "pri"]
    assert "reverse" in inspect.signature(kombu_redis.Channel._get_message_priority).parameters
    assert "_expires" in inspect.getsource(kombu_redis.Channel._put)
