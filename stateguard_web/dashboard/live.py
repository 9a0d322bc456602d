"""A live page's re-read: only its live regions, rendered once for every open page alike.

An open page re-reads itself when runs' events arrive (static/js/dashboard.js, header
``X-Live-Refresh``). Every open page gets the same events at the same moment, so fifty open
pages asked for fifty full renders at once, and the last waited for all the others
(docs/benchmarks.md, "The cockpit's pages"). Here a re-read gets a fragment: the navigation's
counts, the workers banner and the page's live regions, nothing of its reader's own (no name,
no CSRF token, no messages). Re-reads of the same URL by readers who see the same runs with the
same permissions (``audience``) share a render.

A shared render must not be older than the events its reader has seen. Each batch of events
carries its place in the order of all batches (``seq``, from ``sagas.events.position``, counted
after their commits and before they were sent); a render notes the position before it reads,
and a re-read that says it saw up to ``seq`` (header ``X-Live-Seen``) may take any render that
noted as much: it holds every commit the reader heard of. A re-read that says nothing (the
first after a socket opened, when events may have been missed) takes a render that started
after it arrived, never one under way: it waits for that one to end, then one of the waiting
re-reads renders for all of them. A key has at most one render in flight per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string

from stateguard_web.accounts import access
from stateguard_web.dashboard.context_processors import navigation
from stateguard_web.sagas import events

HEADER = "X-Live-Refresh"
SEEN_HEADER = "X-Live-Seen"
WAIT = 10.0  # seconds a re-read waits for another's render before it renders on its own
KEEP = 256  # keys remembered per process; the oldest go first


@dataclass(slots=True)
class _Slot:
    started: float = float("-inf")  # when the kept render started (time.monotonic)
    seq: int | None = None  # the events' position it noted before it read (None: unknown)
    body: str = ""
    busy: bool = False  # a render is in flight

    def holds(self, arrived: float, seen: int | None) -> bool:
        """Whether the kept render holds what a re-read that arrived then, having seen
        events up to ``seen``, must show."""
        if seen is not None and self.seq is not None and self.seq >= seen:
            return True
        return self.started >= arrived


class SharedRenders:
    """Renders per key, each shared by the requests that arrived before it started."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._slots: dict[Hashable, _Slot] = {}
        self.waiting = 0  # requests waiting for another's render now

    def get(self, key: Hashable, render_body: Callable[[], tuple[int | None, str]],
            seen: int | None = None) -> str:
        """The body for ``key``: a kept render that holds what this request must show, or a
        new one; ``render_body`` gives the position it noted before reading, and the body."""
        arrived = time.monotonic()
        with self._changed:
            slot = self._slots.pop(key, None) or _Slot()
            self._slots[key] = slot  # the newest last: pruning drops the oldest first
            while (slot.busy and not slot.holds(arrived, seen)
                   and time.monotonic() - arrived < WAIT):
                self.waiting += 1
                self._changed.wait(WAIT)
                self.waiting -= 1
            if slot.holds(arrived, seen):
                return slot.body
            slot.busy = True
            self._prune()
        started = time.monotonic()
        try:
            seq, body = render_body()
        except BaseException:
            with self._changed:
                slot.busy = False
                self._changed.notify_all()  # a waiting request tries on its own
            raise
        with self._changed:
            if started > slot.started:
                slot.started, slot.seq, slot.body = started, seq, body
            slot.busy = False
            self._changed.notify_all()
        return body

    def _prune(self) -> None:
        while len(self._slots) > KEEP:
            oldest = next(iter(self._slots))
            if self._slots[oldest].busy:
                return
            del self._slots[oldest]


_shared = SharedRenders()


def audience(user: Any) -> Hashable:
    """What a fragment depends on besides its URL: the runs the reader may see and what the
    reader may do with them. Readers of every run with the same permissions share renders; a
    reader of their own runs shares only with themselves."""
    if user.is_superuser:
        return ("superuser",)
    return (frozenset(user.get_all_permissions()),
            None if access.reads_all_runs(user) else user.pk)


def seen(request: HttpRequest) -> int | None:
    """The newest events' position the re-read's page has seen (``X-Live-Seen``), if it
    says; what is not a position counts as not said."""
    text = request.headers.get(SEEN_HEADER, "")
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


def page(request: HttpRequest, template: str, build: Callable[[], dict[str, Any]], *,
         regions: Sequence[str]) -> HttpResponse:
    """The page, or for a live re-read only its ``regions`` (templates, each a live region
    that ``template`` includes), rendered once for its audience (``SharedRenders``)."""
    if request.headers.get(HEADER) != "1" or request.method != "GET":
        return render(request, template, build())
    user = request.user

    def fragment() -> tuple[int | None, str]:
        seq = events.position()  # before any read
        return seq, render_to_string("live.html", {**build(), **navigation(user),
                                                   "regions": regions})

    body = _shared.get((request.path, request.GET.urlencode(), audience(user)), fragment,
                       seen=seen(request))
    response = HttpResponse(body)
    response["Cache-Control"] = "no-store"
    return response
