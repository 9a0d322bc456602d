"""ReusedThreadsHandler (stateguard_web/threads.py): a request's sync code runs on a thread
kept from earlier requests, one request at a time per thread, and still ends with its database
connection given back."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import HttpCommunicator
from django.core.signals import request_finished, request_started
from django.db import connection

from stateguard_web.asgi import application
from stateguard_web.threads import ReusedThreadsHandler


def _thread() -> str:
    """This thread, as no later thread can be: the system reuses the ids of ended threads."""
    current = threading.current_thread()
    if not hasattr(current, "test_tag"):
        current.test_tag = uuid.uuid4().hex  # type: ignore[attr-defined]
    return current.test_tag  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def seen() -> Iterator[list[dict[str, Any]]]:
    """What each request's ``request_started``/``request_finished`` receivers saw (they run
    on the request's sync thread, after Django's own)."""
    events: list[dict[str, Any]] = []

    def started(**_: Any) -> None:
        events.append({"at": "started", "thread": _thread()})

    def finished(**_: Any) -> None:
        events.append({"at": "finished", "thread": _thread(),
                       "connection_open": connection.connection is not None})

    request_started.connect(started, weak=False)
    request_finished.connect(finished, weak=False)
    yield events
    request_started.disconnect(started)
    request_finished.disconnect(finished)


async def _get(path: str) -> dict[str, Any]:
    communicator = HttpCommunicator(application, "GET", path, headers=[(b"host", b"localhost")])
    response = await communicator.get_response(timeout=10)
    await communicator.wait(timeout=10)  # the request's end: request_finished
    return response


def test_the_site_and_the_keyed_api_use_it() -> None:
    http = application.application_mapping["http"]
    site = getattr(http.site, "application", http.site)  # DEBUG serves static files around it
    assert isinstance(site, ReusedThreadsHandler)
    assert isinstance(http.keyed, ReusedThreadsHandler)


@pytest.mark.django_db(transaction=True)
def test_requests_one_after_another_run_on_one_kept_thread(seen: list[dict[str, Any]]) -> None:
    for _ in range(3):
        assert async_to_sync(_get)("/api/health")["status"] in (200, 503)  # reads the database
    threads = {e["thread"] for e in seen}
    assert len(seen) == 6 and len(threads) == 1
    assert threads != {_thread()}  # not this (the main) thread
    assert not any(e.get("connection_open") for e in seen if e["at"] == "finished")


@pytest.mark.django_db(transaction=True)
def test_requests_at_once_each_get_a_thread_of_their_own(seen: list[dict[str, Any]]) -> None:
    both_started = threading.Barrier(2, timeout=5)  # on one thread, the second never starts

    def wait_for_the_other(**_: Any) -> None:
        both_started.wait()

    request_started.connect(wait_for_the_other, weak=False)
    try:
        async def two() -> list[dict[str, Any]]:
            return list(await asyncio.gather(_get("/healthz"), _get("/healthz")))

        responses = async_to_sync(two)()
    finally:
        request_started.disconnect(wait_for_the_other)
    assert [r["status"] for r in responses] == [200, 200]
    assert len({e["thread"] for e in seen if e["at"] == "started"}) == 2


def test_a_request_that_did_not_end_normally_leaves_its_thread_to_no_one() -> None:
    """Cancelled (Daphne gives up on a request after its client left) or failed, its view may
    still run on that thread: the next request must not wait behind it."""
    handler = ReusedThreadsHandler()
    used: list[str] = []

    async def ends(scope: Any, receive: Any, send: Any) -> None:
        used.append(await sync_to_async(_thread)())

    async def fails(scope: Any, receive: Any, send: Any) -> None:
        await ends(scope, receive, send)
        raise RuntimeError("the client left")

    handler.handle = ends  # type: ignore[method-assign]
    async_to_sync(handler)({"type": "http"}, None, None)
    assert len(handler._idle) == 1
    handler.handle = fails  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        async_to_sync(handler)({"type": "http"}, None, None)
    assert handler._idle == []  # the kept thread served it, and was not kept again
    handler.handle = ends  # type: ignore[method-assign]
    async_to_sync(handler)({"type": "http"}, None, None)
    assert used[0] == used[1] != used[2]
