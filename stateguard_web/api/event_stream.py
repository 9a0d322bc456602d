"""``GET /api/runs/{code}/events``: a run's events as Server-Sent Events, for clients that are
not browsers (``stateguard.client``'s ``events`` and ``wait``).

Each event is ``id: <cursor>``, ``event: <type>`` and ``data: <JSON>`` in the websocket's
shape; which events there are, and what an id means, is ``runs.journal_events``'. A client
that reconnects with ``Last-Event-ID`` gets what it missed, from the database, then the rest.

Under ASGI (Daphne) the response streams until the run stops: what the client missed, then
each change, then the stopped status, then the end. A worker's live updates to the run's
group (``sagas.events``) ring a bell: each one makes the stream read the journal again. Every
``STATEGUARD_EVENTS_POLL_SECONDS`` it also checks, in one query, whether the journal changed
(an update lost while Redis was down), and reads the facts only if it did. A quiet stream
gets a comment every ``STATEGUARD_EVENTS_HEARTBEAT_SECONDS``, for the proxies' read timeouts
and to notice a client that left; the caller's credentials are checked again then (a key
revoked meanwhile ends the stream; the reconnect gets its 401).

Under WSGI (gunicorn) a response that waited would hold one of the process's few threads for
as long as the run lasts (a paused run: days). The answer is what the journal holds now, with
``retry`` set to the poll period: an SSE client reconnects after it with its last id, so it
polls, losing and repeating nothing. docs/deploy.md routes the path to Daphne instead.

A run that stopped, whose events the client has all, is a ``204``: an SSE client stops
reconnecting on it (an ``EventSource`` would reconnect for ever after the stream's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from stateguard_web.runs import journal_events
from stateguard_web.runs.journal_events import STOPPED, Cursor
from stateguard_web.sagas.events import run_group
from stateguard_web.sagas.models import Run

logger = logging.getLogger("stateguard_web.api")
CONTENT_TYPE = "text/event-stream"
_RECONNECT_MS = 1000  # a streamed client's wait before it reconnects (the stream was cut)


@dataclass(slots=True)
class _Read:
    frames: str  # what to send: events, each with its id
    stopped: bool  # the run stopped (or is gone): the stream ends after these
    seen: tuple[object, ...] | None = None  # the journal's fingerprint when it was read


def _frame(event: dict[str, object], cursor: Cursor) -> str:
    return (f"id: {cursor.id()}\nevent: {event['type']}\n"
            f"data: {json.dumps(event, separators=(',', ':'))}\n\n")


def _run(run_pk: int) -> Run | None:
    runs = Run.objects.filter(pk=run_pk).only("code", "status", "error", "updated_at")
    return journal_events.watched(runs).first()


def _read(run_pk: int, cursor: Cursor) -> _Read:
    """What the client has not had yet, advancing ``cursor`` over it. The status first, then
    the facts: every fact that led to a status read is then among them."""
    run = _run(run_pk)
    if run is None:  # deleted meanwhile: nothing more will come
        return _Read("", True)
    frames = []
    for fact in cursor.new(journal_events.facts(run=run, after=cursor.after)):
        cursor.sent(fact)
        frames.append(_frame(fact.event, cursor))
    if run.status != cursor.status:
        cursor.status = run.status
        frames.append(_frame(journal_events.status_event(run), cursor))
    return _Read("".join(frames), run.status in STOPPED, journal_events.fingerprint(run))


def _changed(run_pk: int, seen: tuple[object, ...] | None) -> bool:
    """Whether the journal wrote something of the run since ``seen`` (one query: what an idle
    stream's poll costs, where reading the facts took four or five)."""
    run = _run(run_pk)
    return run is None or journal_events.fingerprint(run) != seen


def respond(request: HttpRequest, run: Run, cursor: Cursor,
            allowed: Callable[[], bool]) -> HttpResponse:
    """The response to an authorized request for ``run``'s events after ``cursor``.
    ``allowed`` says whether the caller's credentials still let it see the run."""
    first = _read(run.pk, cursor)
    if first.stopped and not first.frames:
        return HttpResponse(status=204)
    if not isinstance(request, ASGIRequest):
        retry = round(settings.STATEGUARD_EVENTS_POLL_SECONDS * 1000)
        response: HttpResponse | StreamingHttpResponse = HttpResponse(
            f"retry: {retry}\n\n{first.frames}", content_type=CONTENT_TYPE)
    else:
        response = StreamingHttpResponse(_live(run, cursor, first, allowed),
                                         content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response


async def _live(run: Run, cursor: Cursor, first: _Read,
                allowed: Callable[[], bool]) -> AsyncIterator[str]:
    yield f"retry: {_RECONNECT_MS}\n\n{first.frames}"
    # The view's database connection belongs to the request's thread, which Django closes when
    # the response ends: days later, for a stream. Held that long, open streams took every
    # connection PostgreSQL had (measured: with max_connections 100, the 92nd stream was
    # refused). Closed now, in that thread (thread-sensitive); a pooled one goes back to the
    # pool.
    await sync_to_async(connections.close_all)()
    if first.stopped:
        return
    # Reads go to the executor's threads, not one thread per open stream; each read's
    # connection is closed after it (or returned to the pool: DATABASE_POOL).
    read = database_sync_to_async(_read, thread_sensitive=False)
    changed = database_sync_to_async(_changed, thread_sensitive=False)
    still_allowed = database_sync_to_async(allowed, thread_sensitive=False)
    async with _Bell(run_group(str(run.code))) as bell:
        poll = settings.STATEGUARD_EVENTS_POLL_SECONDS
        heartbeat = settings.STATEGUARD_EVENTS_HEARTBEAT_SECONDS
        quiet_since = time.monotonic()
        # Joined before this read: a change committed before it is in it, one after it
        # rings the bell.
        got = await read(run.pk, cursor)
        while True:
            if got.frames:
                yield got.frames
                quiet_since = time.monotonic()
            if got.stopped:
                return
            # Jittered: streams opened together (clients reconnecting after a deploy) would
            # otherwise poll and beat together, a burst of reads a live update waits behind
            # (measured: 200 streams, p95 616 ms from a publish to its client).
            beat_at = quiet_since + heartbeat * random.uniform(0.8, 1.0)
            wait = min(poll * random.uniform(0.8, 1.2), beat_at - time.monotonic())
            rang = await bell.wait(max(0.0, wait))
            if time.monotonic() >= beat_at:
                if not await still_allowed():
                    return
                yield ": heartbeat\n\n"
                quiet_since = time.monotonic()
            if rang or await changed(run.pk, got.seen):
                got = await read(run.pk, cursor)
            else:
                got = _Read("", False, got.seen)


class _Bell:
    """Rings when the run's group gets a live update (``sagas.events``): a channel of its own
    in the group, read by a task. Without a channel layer it never rings (the stream polls)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.rang = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Bell:
        if self.layer is not None:
            try:
                self.channel = await self.layer.new_channel()
                await self.layer.group_add(self.group, self.channel)
            except Exception as exc:  # Redis down: poll
                logger.warning("events of %s: polling, no live updates (%s)", self.group, exc)
                self.channel = None
            else:
                self.task = asyncio.create_task(self._listen())
        return self

    async def _listen(self) -> None:
        assert self.layer is not None and self.channel is not None
        while True:
            try:
                await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: the stream polls until it is back
                logger.warning("events of %s: live updates lost (%s)", self.group, exc)
                await asyncio.sleep(settings.STATEGUARD_EVENTS_POLL_SECONDS)
                continue
            self.rang.set()

    async def wait(self, timeout: float) -> bool:
        """Until the bell rings (True) or ``timeout`` seconds have passed (False)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.rang.wait(), timeout)
        rang = self.rang.is_set()
        self.rang.clear()
        return rang

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.layer is not None and self.channel is not None:
            # Redis down: the membership expires on its own (the layer's group_expiry)
            with contextlib.suppress(Exception):
                await self.layer.group_discard(self.group, self.channel)
