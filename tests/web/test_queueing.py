"""A submitted run queued by one LPUSH of Celery's own message (stateguard_web/sagas/queueing.py,
``run_execute.delay``): the same message Celery's publish sends, but for its ids and argument,
and one a real worker runs."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from stateguard_web import broker
from stateguard_web.sagas import queueing, services, tasks
from stateguard_web.sagas.models import Run
from tests.web.conftest import Workers, wait_for

# What differs between two delay() calls from one thread: each message's own ids and argument.
OWN = {("headers", "id"), ("headers", "root_id"), ("headers", "argsrepr"),
       ("properties", "correlation_id"), ("properties", "delivery_tag"), ("body",)}


@pytest.fixture(autouse=True)
def unlearnt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks.run_execute, "_template", None)  # as in a new process


def template() -> queueing._Template | None:
    return tasks.run_execute._template


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
    tasks.run_execute.apply_async((6,))  # Celery's, for comparison
    tasks.run_execute.delay(7)  # the process's first: through Celery, learnt
    assert template() is not None
    tasks.run_execute.delay(8)  # one LPUSH
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
    tasks.run_execute.delay(7)
    learnt = template()
    assert learnt is not None

    def broken(self: Any, pk: int) -> None:
        raise redis.ConnectionError("the connection went away")

    monkeypatch.setattr(type(learnt), "push", broken)
    tasks.run_execute.delay(8)  # kombu's retries and reconnection: still queued
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
    tasks.run_execute.delay(7)
    assert template() is None
    tasks.run_execute.delay(8)
    first, second = messages(queue)
    assert first["headers"]["expires"] != second["headers"]["expires"]  # each delay()'s own


def test_a_channel_kombu_closed_is_not_used_again(queue: redis.Redis) -> None:
    """After a lost connection kombu closes its channels (and makes new ones): the next run
    goes through delay(), and a template is learnt anew on the new channel."""
    tasks.run_execute.delay(7)
    old = template()
    assert old is not None
    old.channel.close()
    tasks.run_execute.delay(8)
    new = template()
    assert new is not None and new.channel is not old.channel
    tasks.run_execute.delay(9)
    assert [m["headers"]["argsrepr"] for m in messages(queue)] == ["(7,)", "(8,)", "(9,)"]


def test_a_forked_process_learns_its_own(queue: redis.Redis,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    tasks.run_execute.delay(7)
    inherited = template()
    assert inherited is not None
    monkeypatch.setattr(queueing.os, "getpid", lambda: inherited.pid + 1)  # as in a child
    tasks.run_execute.delay(8)
    own = template()
    assert own is not None and own is not inherited
    assert own.pid == inherited.pid + 1


def test_each_thread_says_its_own_reply_to(queue: redis.Redis) -> None:
    tasks.run_execute.delay(7)  # learnt on this thread
    elsewhere: list[str] = []

    def on_another_thread() -> None:
        tasks.run_execute.apply_async((8,))  # Celery's
        tasks.run_execute.delay(9)
        elsewhere.append(tasks.run_execute.app.thread_oid)

    thread = threading.Thread(target=on_another_thread)
    thread.start()
    thread.join()
    mine, celerys, templated = messages(queue)
    assert celerys["properties"]["reply_to"] == templated["properties"]["reply_to"] == \
        elsewhere[0] != mine["properties"]["reply_to"]


def test_a_worker_runs_the_runs_queued_by_one_lpush(workers: Workers, sandbox: Path) -> None:
    first = services.run_submit(agent="provision", input={"name": "q-1"})
    assert template() is not None  # the next ones take one LPUSH
    others = [services.run_submit(agent="provision", input={"name": f"q-{n}"}) for n in (2, 3)]
    workers.start("w1")
    for run in (first, *others):
        wait_for(lambda run=run: Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED,
                 60, f"run {run.input['name']} to succeed", workers.logs)
