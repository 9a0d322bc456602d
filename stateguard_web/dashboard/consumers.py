"""Websockets that keep the dashboard's pages live: ``ws/runs/`` (every run the user may see),
``ws/runs/<code>/`` (one run) and ``ws/batches/<code>/`` (one batch's progress).

They forward what ``sagas.events`` publishes to the groups ``runs`` and ``run.<code>``: batches
``{"type": "run.events", "events": [payload, ...]}``, oldest first. Access is checked once, in
``connect()``, by ``accounts.access`` (the router in ``asgi`` has already checked the Origin and
read the session): an anonymous user, a user with no role, or a submitter asking for someone
else's run is refused during the handshake. On the list socket a submitter hears only its own
runs (filtered per batch; the few lookups it needs are remembered).

A page sends one thing: ``{"type": "ping"}`` (answered ``{"type": "pong"}``), a heartbeat that
lets it notice a connection that died silently. Anything else closes that socket and only it,
with a close code of the application's own range (4000-4999; docs/api.md): a frame over
``MAX_FRAME`` characters 4009 ("too big"), one that is binary, not JSON or not a ping 4003
("unsupported"). Not the protocol's 1009 and 1003: those are the server's own to send, and
autobahn (Daphne's websocket layer) refuses them from an application with an exception, which
Daphne logs with a traceback and turns into 1011 for the client. A frame over Daphne's own
limit (``--websocket-max-message-size``, 1 MiB by default) never reaches the consumer:
autobahn drops the connection without a close frame (the browser reports 1006).

When the channel layer's Redis goes away (a restart loses every group with its data), the
socket is closed with 4013 ("try again later"), not left to crash into Daphne's 1011 and a
traceback: the page connects again with backoff, joins its group on the Redis that is back,
and re-reads itself, so it misses nothing (issue 22 §2).
"""

from __future__ import annotations

import json
import logging
import uuid
from abc import ABC, abstractmethod
from typing import Any

import redis
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.sagas.events import ALL_RUNS_GROUP, batch_group, run_group
from stateguard_web.sagas.models import Batch, Run

logger = logging.getLogger("stateguard_web.dashboard")
MAX_FRAME = 1024
# 4000 + the protocol's code for the same reason (1003 unsupported data, 1009 too big, 1013
# try again later).
CLOSE_UNSUPPORTED, CLOSE_TOO_BIG, CLOSE_TRY_AGAIN = 4003, 4009, 4013
_FORWARDED = frozenset({"run.events", "batch.events"})  # the publisher's batches
_REMEMBERED = 10_000  # run codes a submitter's list socket remembers as its own or not


class _LiveConsumer(AsyncJsonWebsocketConsumer, ABC):  # type: ignore[misc]
    group: str | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except redis.RedisError as exc:  # the channel layer's Redis: see the docstring
            logger.warning("websocket %s closed: the channel layer is unreachable (%s)",
                           scope.get("path"), exc)
            # Before the handshake was accepted (joining the group failed), this refuses it.
            await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN})

    @abstractmethod
    async def authorize(self) -> str | None:
        """The group to listen to, or ``None`` to refuse the connection (each page's
        consumer says which group it listens to, and who may)."""

    async def connect(self) -> None:
        group = await self.authorize()
        if group is None or self.channel_layer is None:
            await self.close()  # before accept(): the handshake is refused (HTTP 403)
            return
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' ``dispatch``, without its hop to the sync thread before each message
        (``aclose_old_connections``) for the publisher's batches: every open page gets each
        one, and the hops, queued on that one thread, were a third of the server's CPU per frame
        (P5, docs/benchmarks.md). Their handlers that read the database do so through
        ``database_sync_to_async``, which closes stale connections itself."""
        if message["type"] in _FORWARDED:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def disconnect(self, code: int) -> None:
        if self.group is not None and self.channel_layer is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None,
                      bytes_data: bytes | None = None) -> None:
        if text_data is None or bytes_data is not None:
            await self.close(code=CLOSE_UNSUPPORTED)
            return
        if len(text_data) > MAX_FRAME:
            await self.close(code=CLOSE_TOO_BIG)
            return
        try:
            message = json.loads(text_data)
        except ValueError:
            message = None
        if message != {"type": "ping"}:
            await self.close(code=CLOSE_UNSUPPORTED)
            return
        await self.send_json({"type": "pong"})

    async def run_events(self, event: dict[str, Any]) -> None:
        """A batch from the publisher (``sagas.events``), forwarded as it is, in its order."""
        events = await self.visible(event["events"])
        if events:
            await self.send_json(_frame("run.events", events, event))

    async def visible(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return events


class RunConsumer(_LiveConsumer):
    """One run's events, for its detail page."""

    async def authorize(self) -> str | None:
        code = str(self.scope["url_route"]["kwargs"]["code"])
        return run_group(code) if await self._may_view(code) else None

    @database_sync_to_async  # type: ignore[misc]
    def _may_view(self, code: str) -> bool:
        run = Run.objects.filter(code=code).first()
        return run is not None and access.may(self.scope.get("user"), Ability.VIEW, run)


class BatchConsumer(_LiveConsumer):
    """One batch's progress (``batches``), for its page: for whoever may see every run
    (a batch is about everyone's runs)."""

    async def authorize(self) -> str | None:
        code = str(self.scope["url_route"]["kwargs"]["code"])
        return batch_group(code) if await self._may_view(code) else None

    @database_sync_to_async  # type: ignore[misc]
    def _may_view(self, code: str) -> bool:
        return (access.reads_all_runs(self.scope.get("user"))
                and Batch.objects.filter(code=code).exists())

    async def batch_events(self, event: dict[str, Any]) -> None:
        await self.send_json(_frame("batch.events", event["events"], event))


class RunsConsumer(_LiveConsumer):
    """Every run's events that the user may see, for the runs list, the inboxes and the
    navigation's counts."""

    reads_all = False

    async def authorize(self) -> str | None:
        may_view, self.reads_all = await self._abilities()
        self.mine: dict[str, bool] = {}
        return ALL_RUNS_GROUP if may_view else None

    @database_sync_to_async  # type: ignore[misc]
    def _abilities(self) -> tuple[bool, bool]:
        user = self.scope.get("user")
        return access.may(user, Ability.VIEW), access.reads_all_runs(user)

    async def visible(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.reads_all:
            return events
        unknown = {str(e.get("run")) for e in events} - set(self.mine)
        if unknown:
            if len(self.mine) > _REMEMBERED:
                self.mine.clear()
            self.mine.update(await self._own(unknown))
        return [e for e in events if self.mine.get(str(e.get("run")))]

    @database_sync_to_async  # type: ignore[misc]
    def _own(self, codes: set[str]) -> dict[str, bool]:
        valid = {c for c in codes if _is_uuid(c)}
        seen = {str(c) for c in access.visible_runs(self.scope.get("user"))
                .filter(code__in=valid).values_list("code", flat=True)}
        return {c: c in seen for c in codes}


def _frame(type: str, events: list[dict[str, Any]], message: dict[str, Any]) -> dict[str, Any]:
    """A page's frame: the events, and the batch's place in the order of all (``seq``) for
    the page's re-reads (dashboard/live.py)."""
    frame = {"type": type, "events": events}
    if isinstance(message.get("seq"), int):
        frame["seq"] = message["seq"]
    return frame


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
