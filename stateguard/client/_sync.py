"""``Client``: the API over httpx, blocking. ``AsyncClient`` (``_async``) is its twin; what
they share (the calls, retries, the events' state) is ``_calls``."""

from __future__ import annotations

import builtins
from collections.abc import Generator, Iterable, Iterator
from contextlib import closing
from datetime import datetime
from time import sleep
from types import TracebackType
from typing import Any, TypeVar

import httpx

from stateguard.client import _calls as calls
from stateguard.client._calls import Base, Call, Follow, NoEventStream
from stateguard.client._errors import ConnectionFailed
from stateguard.client._models import Agent, Event, Run, RunDetail, RunPage

T = TypeVar("T")


class Client(Base):
    """A client of one StateGuard deployment's API, acting with one API key::

        with Client(base_url="https://stateguard.example.com", api_key=KEY) as sg:
            run = sg.submit("checkout", {"email": "a@b.co", "amount": 4200},
                            idempotency_key="order-42")
            done = sg.wait(run.code, timeout=300)   # a RunDetail, once the run stopped

    ``timeout``: seconds for each request (connect, read, write). ``retries`` and
    ``backoff``: how often and after how long a request that got no answer, or a proxy's
    502/503/504, is sent again (reads and submissions after any such failure; operator
    actions only when they surely never arrived). ``http``: an ``httpx.Client`` of your own
    (its transport, proxies, TLS settings); the key and base URL are set on each request.
    """

    def __init__(self, *, base_url: str, api_key: str, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.5, http: httpx.Client | None = None
                 ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, timeout=timeout,
                         retries=retries, backoff=backoff)
        self._own = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self._http.close()

    def _send(self, call: Call[T]) -> T:
        for attempt in range(self._retry.retries + 1):
            try:
                response = self._http.request(**self._request(call))
            except httpx.TransportError as exc:
                sleep(self._retry.after_error(call, exc, attempt))
                continue
            pause = self._retry.after_response(call, response, attempt)
            if pause is None:
                return call.parse(response)
            sleep(pause)
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    # -- runs -------------------------------------------------------------------------------
    def submit(self, agent: str, input: dict[str, Any] | None = None, *,
               idempotency_key: str | None = None) -> Run:
        """Submit a run of ``agent``. The idempotency key (one is made when none is given)
        makes a retry safe: the same key from the same key's user again gives back the same
        run (``replayed``). Give your own (an order's id) to be safe across processes too."""
        return self._send(calls.submit(agent, input, idempotency_key))

    def get(self, code: object) -> RunDetail:
        """The run with its steps, compensations, effects, approvals and audit trail."""
        return self._send(calls.get(code))

    def agents(self) -> builtins.list[Agent]:
        return self._send(calls.agents())

    def list(self, *, status: str | Iterable[str] | None = None, agent: str | None = None,
             q: str | None = None, created_after: datetime | None = None,
             created_before: datetime | None = None, sort: str | None = None,
             limit: int = 50, offset: int = 0) -> RunPage:
        """A page of the runs this key may see, of any of ``status`` (one or several),
        newest first or in the order ``sort`` names ("-duration": longest first;
        docs/api.md, GET /api/runs)."""
        return self._send(calls.list_runs(status=status, agent=agent, q=q,
                                          created_after=created_after,
                                          created_before=created_before, sort=sort,
                                          limit=limit, offset=offset))

    # -- operator actions (a worker carries each out: the run's ``request`` says so) ---------
    def approve(self, code: object, approval: int | None = None, *, reason: str = "") -> Run:
        """Approve the gated step; ``approval`` is its id (default: the run's one pending)."""
        if approval is None:
            approval = calls.pending_approval(self.get(code))
        return self._send(calls.action(code, "approve", calls.decision(approval, reason)))

    def reject(self, code: object, approval: int | None = None, *, reason: str = "") -> Run:
        """Reject the gated step: the run unwinds."""
        if approval is None:
            approval = calls.pending_approval(self.get(code))
        return self._send(calls.action(code, "reject", calls.decision(approval, reason)))

    def retry(self, code: object, *, from_step: str | None = None,
              update: dict[str, Any] | None = None) -> Run:
        """Resume a failed run where it failed; ``from_step``: undo that step and those
        after it, then run again from before it, with ``update`` set in its state."""
        return self._send(calls.retry(code, from_step, update))

    def compensate(self, code: object, *, reason: str = "") -> Run:
        """Undo what the run did, newest first."""
        return self._send(calls.action(code, "compensate", {"reason": reason}))

    def resolve(self, code: object, *, note: str) -> Run:
        """Mark a run that needs attention compensated: ``note`` says what was done by hand."""
        return self._send(calls.action(code, "resolve", {"note": note}))

    def retry_compensation(self, id: int) -> Run:
        """Run one failed (or waiting) compensation again, with its idempotency key."""
        return self._send(calls.retry_compensation(id))

    # -- following a run --------------------------------------------------------------------
    def events(self, code: object, *, last_event_id: str | None = None) -> Iterator[Event]:
        """The run's events, oldest first, until it stops (succeeded, compensated, failed,
        needs attention); after ``last_event_id``, only the later ones. A dropped connection
        is resumed where it was cut, none lost or repeated."""
        follow = self._follow_state(code, last_event_id)
        with closing(self._follow(follow)) as events:
            yield from events

    def _follow(self, follow: Follow) -> Generator[Event]:
        while not follow.done:
            try:
                with self._http.stream(**self._stream(follow)) as response:
                    if not follow.streams(response):
                        response.read()
                        pause = follow.refused(response)
                        if pause is not None:
                            sleep(follow.bounded(pause))
                        continue
                    for line in response.iter_lines():
                        event = follow.line(line)
                        if event is not None:
                            yield event
                        if follow.done:
                            return
            except httpx.TransportError as exc:
                sleep(follow.bounded(follow.failed(exc)))
                continue
            sleep(follow.bounded(follow.ended()))

    def wait(self, code: object, *, timeout: float | None = None,
             until: Iterable[str] | None = None, poll: float = 1.0) -> RunDetail:
        """Until the run reaches a status of ``until`` (default: it stopped: succeeded,
        compensated, failed or needs_attention), then the run. Follows its events; polls
        every ``poll`` seconds where the server has no event stream. ``WaitTimeout`` after
        ``timeout`` seconds."""
        wanted = calls.until_statuses(until)
        follow = self._follow_state(code, timeout=timeout)
        try:
            with closing(self._follow(follow)) as events:
                for event in events:
                    if event.status in wanted:
                        return self.get(code)
        except (NoEventStream, ConnectionFailed):
            pass  # poll instead (where that fails too, the server is gone: raised)
        # Polls also once the run stopped in a status not waited for: a person may move it on.
        while True:
            run = self.get(code)
            follow.status = run.status
            if run.status in wanted:
                return run
            sleep(follow.bounded(poll))
