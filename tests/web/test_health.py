"""GET /api/health: the database, the broker and the workers' heartbeats, each for real.

The broker and workers checks use the test Redis (``STATEGUARD_TEST_REDIS_URL``). "Down" is a
closed port (connection refused, as a stopped service gives) or a port that accepts and never
answers (a hung service, or a firewall that swallows packets).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import time
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.db import connections
from django.test import Client, override_settings

from stateguard_web.monitoring import health, heartbeat
from tests.web.conftest import Workers, wait_for


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(heartbeat.KEY)
    yield client
    client.delete(heartbeat.KEY)
    client.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens on it once this socket closes


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port that accepts connections (the kernel does) and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def get_health() -> tuple[int, dict[str, object], str]:
    response = Client().get("/api/health")
    text = response.content.decode()
    return response.status_code, json.loads(text), text


@pytest.mark.django_db
def test_it_answers_200_when_the_database_and_broker_answer_and_a_worker_beats(
        r: redis.Redis) -> None:
    heartbeat.beat(r, "w1@host-a")  # what each worker does every INTERVAL seconds

    status, body, _ = get_health()

    assert status == 200, body
    assert body["status"] == "ok"
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert checks["database"]["ok"] is True and checks["broker"]["ok"] is True
    assert checks["workers"]["ok"] is True and checks["workers"]["alive"] == 1
    assert checks["workers"]["last_heartbeat_seconds_ago"] < 5


@pytest.mark.django_db
def test_it_answers_503_when_no_worker_beat_in_the_last_minute(r: redis.Redis) -> None:
    seconds, _ = r.time()
    r.zadd(heartbeat.KEY, {"w1@host-a": seconds - 90})  # its last beat, 90 s ago

    status, body, _ = get_health()

    assert status == 503
    assert body["down"] == ["workers"]
    workers = body["checks"]["workers"]  # type: ignore[index]
    assert workers["alive"] == 0 and 89 < workers["last_heartbeat_seconds_ago"] < 100
    assert workers["error"] == "no worker heard from in the last 60 s"


@pytest.mark.django_db
def test_it_answers_503_with_no_worker_ever_seen(r: redis.Redis) -> None:
    status, body, _ = get_health()
    assert status == 503 and body["down"] == ["workers"]
    assert body["checks"]["workers"]["last_heartbeat_seconds_ago"] is None  # type: ignore[index]


@pytest.mark.django_db
def test_it_names_the_broker_when_redis_is_unreachable_and_leaks_no_url(
        r: redis.Redis) -> None:
    heartbeat.beat(r, "w1@host-a")
    port = closed_port()
    with override_settings(CELERY_BROKER_URL=f"redis://:s3cret@127.0.0.1:{port}/0"):
        status, body, text = get_health()

    assert status == 503
    assert body["down"] == ["broker"]
    checks = body["checks"]
    assert checks["database"]["ok"] is True  # type: ignore[index]
    assert checks["broker"] == {"ok": False, "error": "unavailable (ConnectionError)"}  # type: ignore[index]
    assert checks["workers"]["ok"] is None  # type: ignore[index]  # unknown, not down
    assert str(port) not in text and "s3cret" not in text and "redis://" not in text


@pytest.mark.django_db
def test_it_names_the_database_when_it_is_down(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check opens a new connection on its own thread (closing it after), as each web
    # request does: pointing the connection settings at a closed port makes that connect fail
    # for real, while this test's own connection stays open.
    heartbeat.beat(r, "w1@host-a")
    port = closed_port()
    monkeypatch.setitem(connections["default"].settings_dict, "PORT", str(port))

    status, body, text = get_health()

    assert status == 503
    assert body["down"] == ["database"]
    assert body["checks"]["database"] == {  # type: ignore[index]
        "ok": False, "error": "unavailable (OperationalError)"}
    assert body["checks"]["broker"]["ok"] is True  # type: ignore[index]
    assert str(port) not in text


@pytest.mark.django_db
def test_it_answers_within_its_timeout_when_the_database_never_answers(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    heartbeat.beat(r, "w1@host-a")
    with silent_server() as port:
        # Without a bound the connect would wait for a reply that never comes.
        monkeypatch.setitem(connections["default"].settings_dict, "PORT", str(port))
        start = time.monotonic()
        status, body, _ = get_health()
        took = time.monotonic() - start

    assert status == 503 and body["down"] == ["database"]
    assert body["checks"]["database"]["error"] == f"timed out after {health.TIMEOUT} s"  # type: ignore[index]
    assert health.TIMEOUT <= took < health.TIMEOUT + 1


@pytest.mark.django_db
def test_it_answers_within_its_timeout_when_the_broker_never_answers(r: redis.Redis) -> None:
    with silent_server() as port, override_settings(
            CELERY_BROKER_URL=f"redis://127.0.0.1:{port}/0"):
        start = time.monotonic()
        status, body, _ = get_health()
        took = time.monotonic() - start

    assert status == 503 and body["down"] == ["broker"]
    assert took < health.TIMEOUT + 1


@pytest.mark.django_db
def test_it_answers_over_plain_http_without_credentials_when_https_only(
        r: redis.Redis) -> None:
    heartbeat.beat(r, "w1@host-a")
    with override_settings(SECURE_SSL_REDIRECT=True):
        client = Client()  # made here: middleware reads the settings when it is loaded
        assert client.get("/api/health").status_code == 200
        assert client.get("/admin/").status_code == 301


def test_it_counts_a_real_worker_that_beats_and_forgets_it_when_it_stops(
        workers: Workers) -> None:
    r = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert heartbeat.alive(r).count == 0  # the fixture emptied the test Redis
    proc = workers.start("w1")

    wait_for(lambda: get_health()[0] == 200, 30, "the worker's first heartbeat", workers.logs)
    members = [m.decode() for m in r.zrange(heartbeat.KEY, 0, -1)]
    assert len(members) == 1 and members[0].startswith("w1@")

    proc.send_signal(signal.SIGTERM)  # a warm shutdown: the worker says goodbye
    proc.wait(timeout=30)
    assert r.zcard(heartbeat.KEY) == 0
    assert get_health()[1]["down"] == ["workers"]
