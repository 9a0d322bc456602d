"""A submitted run queued by one LPUSH of Celery's own message (stateguard_web/sagas/queueing.py):
the same message ``run_execute.delay()`` sends, but for its ids and argument, and one a real
worker runs."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from stateguard_web import broker
from stateguard_web.sagas import queueing, services, tasks
from stateguard_web.sagas.models import Run
from tests.web.conftest import Workers, wait_for

# What differs between two delay() calls from one thread: each message's own ids and argument.
OWN = {("headers", "id"), ("headers", "root_id"), ("headers", "argsrepr"),
       ("properties", "correlation_id"), ("properties", "delivery_tag"), ("body",)}


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    monkeypatch.setattr(queueing, "_template", None)  # as in a new process
    r = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    r.delete("celery")
    yield r
    r.delete("celery")


def messages(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(m) for m in r.lrange("celery", 0, -1)][::-1]  # LPUSH: newest first


def flat(message: dict[str, Any]) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for key, value in message.items():
        if key in ("headers", "properties"):
            out.update({(key, name): v for name, v in value.items()})
        else:
            out[(key,)] = value
    return out


def test_it_queues_a_run_as_celerys_own_message_with_its_own_ids(queue: redis.Redis) -> None:
    tasks.run_execute.delay(6)  # Celery's, for comparison
    queueing.run_execute_queue(7)  # the process's first: through delay(), learnt
    assert queueing._template is not None
    queueing.run_execute_queue(8)  # one LPUSH
    celerys, first, mine = messages(queue)

    # Celery's two messages differ only in what is each message's own; so does this one.
    assert {k for k, v in flat(first).items() if flat(celerys)[k] != v} == OWN
    assert flat(mine).keys() == flat(first).keys()
    assert {k for k, v in flat(mine).items() if flat(first)[k] != v} == OWN
    assert mine["headers"]["id"] == mine["headers"]["root_id"] == \
        mine["properties"]["correlation_id"] != first["headers"]["id"]
    assert mine["headers"]["argsrepr"] == "(8,)"
    args, kwargs, embed = json.loads(base64.b64decode(mine["body"]))
    assert (args, kwargs) == ([8], {})
    assert embed == json.loads(base64.b64decode(first["body"]))[2]


def test_it_goes_through_celery_after_a_redis_error(queue: redis.Redis,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    queueing.run_execute_queue(7)
    template = queueing._template
    assert template is not None

    def broken(self: Any, pk: int) -> None:
        raise redis.ConnectionError("the connection went away")

    monkeypatch.setattr(type(template), "push", broken)
    queueing.run_execute_queue(8)  # kombu's retries and reconnection: still queued
    assert [m["headers"]["argsrepr"] for m in messages(queue)] == ["(7,)", "(8,)"]


def test_it_learns_nothing_from_a_message_it_does_not_know(queue: redis.Redis) -> None:
    put = broker.Put(None, "celery", {"headers": {"task": "other"}})  # type: ignore[arg-type]
    assert queueing._learn(put, tasks.run_execute.name, 7) is None
    assert queueing._learn(None, tasks.run_execute.name, 7) is None


def test_it_learns_no_message_with_a_time_in_it(queue: redis.Redis,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An expiry (or eta) is a time: frozen into a template, every later run would expire."""
    monkeypatch.setattr(tasks.run_execute, "expires", 600)
    monkeypatch.setattr(tasks.run_execute, "_exec_options", None)  # Celery's copy of them
    queueing.run_execute_queue(7)
    assert queueing._template is None
    queueing.run_execute_queue(8)
    first, second = messages(queue)
    assert first["headers"]["expires"] != second["headers"]["expires"]  # each delay()'s own


def test_a_channel_kombu_closed_is_not_used_again(queue: redis.Redis) -> None:
    """After a lost connection kombu closes its channels (and makes new ones): the next run
    goes through delay(), and a template is learnt anew on the new channel."""
    queueing.run_execute_queue(7)
    old = queueing._template
    assert old is not None
    old.channel.close()
    queueing.run_execute_queue(8)
    assert queueing._template is not None and queueing._template.channel is not old.channel
    queueing.run_execute_queue(9)
    assert [m["headers"]["argsrepr"] for m in messages(queue)] == ["(7,)", "(8,)", "(9,)"]


def test_a_forked_process_learns_its_own(queue: redis.Redis,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    queueing.run_execute_queue(7)
    inherited = queueing._template
    assert inherited is not None
    monkeypatch.setattr(queueing.os, "getpid", lambda: inherited.pid + 1)  # as in a child
    queueing.run_execute_queue(8)
    assert queueing._template is not None and queueing._template is not inherited
    assert queueing._template.pid == inherited.pid + 1


def test_each_thread_says_its_own_reply_to(queue: redis.Redis) -> None:
    queueing.run_execute_queue(7)  # learnt on this thread
    elsewhere: list[str] = []

    def on_another_thread() -> None:
        tasks.run_execute.delay(8)
        queueing.run_execute_queue(9)
        elsewhere.append(tasks.run_execute.app.thread_oid)

    thread = threading.Thread(target=on_another_thread)
    thread.start()
    thread.join()
    mine, celerys, templated = messages(queue)
    assert celerys["properties"]["reply_to"] == templated["properties"]["reply_to"] == \
        elsewhere[0] != mine["properties"]["reply_to"]


def test_a_worker_runs_the_runs_queued_by_one_lpush(workers: Workers, sandbox: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queueing, "_template", None)
    first = services.run_submit(agent="provision", input={"name": "q-1"})
    assert queueing._template is not None  # the next ones take one LPUSH
    others = [services.run_submit(agent="provision", input={"name": f"q-{n}"}) for n in (2, 3)]
    workers.start("w1")
    for run in (first, *others):
        wait_for(lambda run=run: Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED,
                 60, f"run {run.input['name']} to succeed", workers.logs)
