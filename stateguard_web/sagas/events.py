"""Live updates: journal changes go to a Channels group per run and one for all runs.

Events are sent only after the surrounding transaction commits, from one event loop per process
that a background thread owns: ``async_to_sync(group_send)`` would build a loop and a Redis
connection per call (~3.4 ms of CPU each, measured), which a worker cannot afford per step.
Publishing never fails a saga: a missing layer or a Redis outage is logged and the event dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import redis
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from django.db import transaction

from stateguard import Event
from stateguard_web.lib import redis_client

logger = logging.getLogger("stateguard.events")
ALL_RUNS_GROUP = "runs"
# An event whose fact is not committed yet (a step row waiting for LangGraph's next write, see
# ``journal.step_rows``) waits for that commit (``committed()``), at most this long.
_HOLD = 0.05  # seconds
# The runs list's group gets at most one message per this many seconds from a process: every
# open list page receives each one (P5, docs/benchmarks.md: Daphne's cost grows with frames).
# So do, together, the groups nobody listened to at their last send or not sent to yet: most
# runs have no open page, and asking Redis after each of their commits cost a worker 2-3x the
# CPU per event (P5). A page's first events therefore wait up to this long; the next go at once.
_LIST_GAP = 0.05  # seconds
_HEARD_KEPT = 5000  # groups remembered as listened to (the oldest are forgotten past this)
# Counts the batches sent by every process, in the channel layer's first Redis: a batch's
# message carries its count ("seq"), taken after its events' commits and before it is sent, so
# that a page that saw seq n knows that anything read after the count reached n holds them
# (dashboard/live.py shares a render among the pages it holds for).
POSITION_KEY = "stateguard:events:position"


def run_group(code: str) -> str:
    return f"run.{code}"


def batch_group(code: object) -> str:
    """A batch's progress (``publish_batch``), for its page."""
    return f"batch.{code}"


def _message_type(group: str) -> str:
    """What a consumer's handler is called for a group's messages (``run_events``...)."""
    return "batch.events" if group.startswith("batch.") else "run.events"


class _Publisher:
    """Sends from one event loop in a daemon thread, one message per group with every event
    waiting for it, oldest first.

    An event goes as soon as what it reports is committed: at once if it is (``written``), else
    when the write carrying it commits (``committed()``, called by the checkpoint saver) or,
    failing that, after ``_HOLD``. Events behind a held one wait with it (order). A run's page
    then hears of a step a send after its commit; the runs list, which every list page hears,
    gets at most one message per ``_LIST_GAP``, its events batched."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.cond = threading.Condition()
        self.held: dict[str, list[dict[str, Any]]] = {}  # not known to be committed yet
        self.held_since = 0.0
        self.commit_seen = False
        self.ready: dict[str, list[dict[str, Any]]] = {}
        self.list_next = 0.0  # when the runs list may get its next message
        self.heard: dict[str, float] = {}  # groups someone listened to at their last send
        self.quiet_next = 0.0  # when the others may get their next messages
        threading.Thread(target=self._run, name="stateguard-events", daemon=True).start()

    def send(self, groups: tuple[str, ...], payload: dict[str, Any], *,
             written: bool = False) -> None:
        if self.layer is None:
            return
        with self.cond:
            if not self.held and written:
                target = self.ready
            else:  # behind a held event: after it. Written, it tells that the held ones are
                target = self.held  # committed too (the journal writes a run in order)
                if not self.held:
                    self.held_since = time.monotonic()
                self.commit_seen = self.commit_seen or written
            for group in groups:
                target.setdefault(group, []).append(payload)
            self.cond.notify()

    def committed(self) -> None:
        """A write that carried journal rows committed: what is held may go."""
        with self.cond:
            if self.held:
                self.commit_seen = True
                self.cond.notify()

    def _take(self) -> dict[str, list[dict[str, Any]]]:
        """Wait for something to send, and take it (under ``cond``)."""
        while True:
            now = time.monotonic()
            if self.held and (self.commit_seen or now >= self.held_since + _HOLD):
                for group, events in self.held.items():
                    self.ready.setdefault(group, []).extend(events)
                self.held, self.commit_seen = {}, False
            out = {g: e for g, e in self.ready.items() if now >= self._next(g)}
            if out:
                for group in out:
                    del self.ready[group]
                if ALL_RUNS_GROUP in out:
                    self.list_next = now + _LIST_GAP
                if any(g != ALL_RUNS_GROUP and g not in self.heard for g in out):
                    self.quiet_next = now + _LIST_GAP
                return out
            waits = [self.held_since + _HOLD - now] if self.held else []
            waits += [self._next(g) - now for g in self.ready]
            self.cond.wait(max(0.0, min(waits)) if waits else None)

    def _next(self, group: str) -> float:
        """When ``group`` may get its next message: a group someone listened to at its last
        send, at once; the list, one per ``_LIST_GAP``; the others (most runs: no page open)
        together, one batch per ``_LIST_GAP``, which also asks Redis whether that changed."""
        if group == ALL_RUNS_GROUP:
            return self.list_next
        return 0.0 if group in self.heard else self.quiet_next

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            with self.cond:
                batch = self._take()
            try:
                loop.run_until_complete(self._send(batch))
            except Exception as exc:  # Redis down: drop this batch, keep the thread
                logger.warning("dropped %d live updates: %s", len(batch), exc)

    async def _send(self, batch: dict[str, list[dict[str, Any]]]) -> None:
        assert self.layer is not None
        listened, seq = await self._listened(list(batch))
        for group in batch:  # this thread alone reads and writes ``heard``
            self.heard.pop(group, None)
            if group in listened:
                self.heard[group] = time.monotonic()  # newest last
        while len(self.heard) > _HEARD_KEPT:
            del self.heard[next(iter(self.heard))]
        for group in listened:
            message = {"type": _message_type(group), "events": batch[group]}
            if seq is not None:
                message["seq"] = seq
            await self.layer.group_send(group, message)

    async def _listened(self, groups: list[str]) -> tuple[list[str], int | None]:
        """The groups someone listens to, and the batch's place in the order of every
        process's batches (``position``). Most runs have no open page: asking Redis once per
        batch, instead of two round trips per group inside ``group_send``, was most of the
        publisher's CPU (P2, docs/benchmarks.md). A page that joins meanwhile misses at most
        this batch, and reads the run's state when it opens anyway."""
        layer = self.layer
        if not isinstance(layer, RedisChannelLayer):
            return groups, None
        # channels_redis's own group keys and shards; members expire after group_expiry
        live_since = int(time.time()) - layer.group_expiry
        shards: dict[int, list[str]] = {0: []}  # the first holds the position: asked with it
        for group in groups:
            shards.setdefault(layer.consistent_hash(group), []).append(group)
        listened, seq = [], None
        for index, members in shards.items():
            pipe = layer.connection(index).pipeline(transaction=False)
            for group in members:
                pipe.zcount(layer._group_key(group), live_since, "+inf")
            if index == 0:
                pipe.incr(POSITION_KEY)
            counts = await pipe.execute()
            if index == 0:
                seq = int(counts.pop())
            listened += [g for g, count in zip(members, counts, strict=True) if count]
        return listened, seq


_publisher: _Publisher | None = None
_lock = threading.Lock()
_journal_holds: Callable[[str], bool] | None = None  # see watch_journal


def _get() -> _Publisher:
    global _publisher
    with _lock:
        if _publisher is None:
            _publisher = _Publisher()
        return _publisher


@cache
def _position_client() -> redis.Redis | None:
    layer = settings.CHANNEL_LAYERS.get("default", {})
    hosts = layer.get("CONFIG", {}).get("hosts") or []
    if not layer.get("BACKEND", "").startswith("channels_redis.") or not hosts:
        return None
    host = hosts[0]
    address = host.get("address") if isinstance(host, dict) else host
    if not isinstance(address, str):
        return None
    return redis_client.client(address, timeout=0.5)  # a page's render waits no longer


def position() -> int | None:
    """How many batches of events every process has sent so far (``POSITION_KEY``); None
    when that is not known (no Redis layer, or Redis does not answer)."""
    client = _position_client()
    if client is None:
        return None
    try:
        return int(client.get(POSITION_KEY) or 0)
    except redis.RedisError:
        return None


def event_payload(event: Event) -> dict[str, Any]:
    return {"type": event.type, "run": event.run_id, "node": event.node,
            "step_id": event.step_id, "data": event.data, "at": event.at}


def publish(event: Event) -> None:
    """The guard's ``on_event``: forward the event to the run's group and the run list.

    Consumers receive ``{"type": "run.events", "events": [payload, ...]}``, oldest first."""
    holds = _journal_holds
    _publish(event.run_id, event_payload(event),
             written=holds is not None and not holds(event.run_id))


def watch_journal(holds: Callable[[str], bool]) -> None:
    """Tell ``publish`` how to know that the journal has yet to write something of a run (a
    step row that goes with LangGraph's next write): its events then wait for ``committed()``.
    Without it, every guard event waits for a commit, or ``_HOLD``."""
    global _journal_holds
    _journal_holds = holds


def committed() -> None:
    """A write that carried the journal's deferred rows committed (the checkpoint saver calls
    this): the events waiting for it go now."""
    if _publisher is not None:
        _publisher.committed()


def publish_change(run_code: object, type: str, **data: Any) -> None:
    """A change the web app makes to a run outside the guard, for the same live views and in
    the same shape as the guard's events: a submission (``run.submitted``), an operator's
    request left for a worker and its end (``run.request``, ``data["action"]`` None once a
    worker carried it out or refused it), a resolution by hand (``run.status``). Sent once the
    surrounding transaction commits, like the guard's."""
    code = str(run_code)
    _publish(code, {"type": type, "run": code, "node": None, "step_id": None, "data": data,
                    "at": time.time()}, written=True)


def _publish(run_id: str, payload: dict[str, Any], *, written: bool) -> None:
    groups = (run_group(run_id), ALL_RUNS_GROUP)
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _safe_send(groups, payload, written=True))
    else:  # autocommit: written already, or it goes with the journal's next write
        _safe_send(groups, payload, written=written)


def _safe_send(groups: tuple[str, ...], payload: dict[str, Any], *, written: bool) -> None:
    try:
        _get().send(groups, payload, written=written)
    except Exception:
        logger.exception("could not publish a live update")


def publish_batch(code: object, type: str, **data: Any) -> None:
    """A batch's progress (``batches.worker``) to its group, once the surrounding transaction
    commits: ``{"type": "batch.events", "events": [{"type": "batch.progress", "batch": code,
    "data": {...}, "at": ...}, ...]}``, oldest first, batched like the runs' events."""
    payload = {"type": type, "batch": str(code), "data": data, "at": time.time()}
    groups = (batch_group(code),)
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _safe_send(groups, payload, written=True))
    else:
        _safe_send(groups, payload, written=True)
