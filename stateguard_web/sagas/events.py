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
from typing import Any

from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import transaction

from stateguard import Event

logger = logging.getLogger("stateguard.events")
ALL_RUNS_GROUP = "runs"
_COALESCE = 0.05  # seconds: live views lag at most this much behind the journal


def run_group(code: str) -> str:
    return f"run.{code}"


def batch_group(code: object) -> str:
    """A batch's progress (``publish_batch``), for its page."""
    return f"batch.{code}"


def _message_type(group: str) -> str:
    """What a consumer's handler is called for a group's messages (``run_events``...)."""
    return "batch.events" if group.startswith("batch.") else "run.events"


class _Publisher:
    """Sends from one event loop in a daemon thread; events that arrive while a send is in
    flight are batched into one message per group (a five-step run emits about a dozen)."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        threading.Thread(target=self._run, name="stateguard-events", daemon=True).start()

    def send(self, groups: tuple[str, ...], payload: dict[str, Any]) -> None:
        if self.layer is None:
            return
        with self.lock:
            for group in groups:
                self.pending.setdefault(group, []).append(payload)
        self.wake.set()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            self.wake.wait()
            time.sleep(_COALESCE)  # let a run's next events join this batch
            self.wake.clear()
            with self.lock:
                batch, self.pending = self.pending, {}
            try:
                loop.run_until_complete(self._send(batch))
            except Exception as exc:  # Redis down: drop this batch, keep the thread
                logger.warning("dropped %d live updates: %s", len(batch), exc)

    async def _send(self, batch: dict[str, list[dict[str, Any]]]) -> None:
        assert self.layer is not None
        for group in await self._listened(list(batch)):
            await self.layer.group_send(group, {"type": _message_type(group),
                                                "events": batch[group]})

    async def _listened(self, groups: list[str]) -> list[str]:
        """The groups someone listens to. Most runs have no open page: asking Redis once per
        batch, instead of two round trips per group inside ``group_send``, was most of the
        publisher's CPU (P2, docs/benchmarks.md). A page that joins meanwhile misses at most
        this batch, and reads the run's state when it opens anyway."""
        layer = self.layer
        if not isinstance(layer, RedisChannelLayer):
            return groups
        # channels_redis's own group keys and shards; members expire after group_expiry
        live_since = int(time.time()) - layer.group_expiry
        shards: dict[int, list[str]] = {}
        for group in groups:
            shards.setdefault(layer.consistent_hash(group), []).append(group)
        listened = []
        for index, members in shards.items():
            pipe = layer.connection(index).pipeline(transaction=False)
            for group in members:
                pipe.zcount(layer._group_key(group), live_since, "+inf")
            counts = await pipe.execute()
            listened += [g for g, count in zip(members, counts, strict=True) if count]
        return listened


_publisher: _Publisher | None = None
_lock = threading.Lock()


def _get() -> _Publisher:
    global _publisher
    with _lock:
        if _publisher is None:
            _publisher = _Publisher()
        return _publisher


def event_payload(event: Event) -> dict[str, Any]:
    return {"type": event.type, "run": event.run_id, "node": event.node,
            "step_id": event.step_id, "data": event.data, "at": event.at}


def publish(event: Event) -> None:
    """The guard's ``on_event``: forward the event to the run's group and the run list.

    Consumers receive ``{"type": "run.events", "events": [payload, ...]}``, oldest first."""
    _publish(event.run_id, event_payload(event))


def publish_change(run_code: object, type: str, **data: Any) -> None:
    """A change the web app makes to a run outside the guard, for the same live views and in
    the same shape as the guard's events: a submission (``run.submitted``), an operator's
    request left for a worker and its end (``run.request``, ``data["action"]`` None once a
    worker carried it out or refused it), a resolution by hand (``run.status``). Sent once the
    surrounding transaction commits, like the guard's."""
    code = str(run_code)
    _publish(code, {"type": type, "run": code, "node": None, "step_id": None, "data": data,
                    "at": time.time()})


def _publish(run_id: str, payload: dict[str, Any]) -> None:
    groups = (run_group(run_id), ALL_RUNS_GROUP)
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _safe_send(groups, payload))
    else:  # autocommit: what the event reports is written already (or goes with the checkpoint)
        _safe_send(groups, payload)


def _safe_send(groups: tuple[str, ...], payload: dict[str, Any]) -> None:
    try:
        _get().send(groups, payload)
    except Exception:
        logger.exception("could not publish a live update")


def publish_batch(code: object, type: str, **data: Any) -> None:
    """A batch's progress (``sagas.batches``) to its group, once the surrounding transaction
    commits: ``{"type": "batch.events", "events": [{"type": "batch.progress", "batch": code,
    "data": {...}, "at": ...}, ...]}``, oldest first, batched like the runs' events."""
    payload = {"type": type, "batch": str(code), "data": data, "at": time.time()}
    groups = (batch_group(code),)
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: _safe_send(groups, payload))
    else:
        _safe_send(groups, payload)
