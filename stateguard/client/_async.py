"""``AsyncClient``: ``Client`` (``_sync``) for asyncio or trio (``anyio``, as httpx). Each
method is its twin's, awaited; what they share (the calls, retries, the events' state) is
``_calls``, so only sending and sleeping are written twice."""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
from anyio import sleep

from stateguard.client import _calls as calls
from stateguard.client._calls import Base, Call, Follow, NoEventStream
from stateguard.client._errors import ConnectionFailed
from stateguard.client._models import Agent, Event, Run, RunDetail, RunPage

T = TypeVar("T")


class AsyncClient(Base):
    """``Client``, awaited::

        async with AsyncClient(base_url="https://stateguard.example.com", api_key=KEY) as sg:
            run = await sg.submit("checkout", {"email": "a@b.co", "amount": 4200})
            async for event in sg.events(run.code):
                print(event.type, event.node)

    The arguments are ``Client``'s; ``http``: an ``httpx.AsyncClient`` of your own.
    """

    def __init__(self, *, base_url: str, api_key: str, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.5, http: httpx.AsyncClient | None = None
                 ) -> None:
        super().__init__(base_url=base_url, api_key=api_key, timeout=timeout,
                         retries=retries, backoff=backoff)
        self._own = http is None
        self._http = http if http is not None else httpx.AsyncClient(timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        for attempt in range(self._retry.retries + 1):
            try:
                response = await self._http.request(**self._request(call))
            except httpx.TransportError as exc:
                await sleep(self._retry.after_error(call, exc, attempt))
                continue
            pause = self._retry.after_response(call, response, attempt)
            if pause is None:
                return call.parse(response)
            await sleep(pause)
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    # -- runs (each method is ``Client``'s, awaited: see its docstring) ----------------------
    async def submit(self, agent: str, input: dict[str, Any] | None = None, *,
                     idempotency_key: str | None = None) -> Run:
        return await self._send(calls.submit(agent, input, idempotency_key))

    async def get(self, code: object) -> RunDetail:
        return await self._send(calls.get(code))

    async def agents(self) -> builtins.list[Agent]:
        return await self._send(calls.agents())

    async def list(self, *, status: str | Iterable[str] | None = None,
                   agent: str | None = None, q: str | None = None,
                   created_after: datetime | None = None,
                   created_before: datetime | None = None, sort: str | None = None,
                   limit: int = 50, offset: int = 0) -> RunPage:
        return await self._send(calls.list_runs(
            status=status, agent=agent, q=q, created_after=created_after,
            created_before=created_before, sort=sort, limit=limit, offset=offset))

    async def approve(self, code: object, approval: int | None = None, *,
                      reason: str = "") -> Run:
        if approval is None:
            approval = calls.pending_approval(await self.get(code))
        return await self._send(calls.action(code, "approve", calls.decision(approval, reason)))

    async def reject(self, code: object, approval: int | None = None, *,
                     reason: str = "") -> Run:
        if approval is None:
            approval = calls.pending_approval(await self.get(code))
        return await self._send(calls.action(code, "reject", calls.decision(approval, reason)))

    async def retry(self, code: object, *, from_step: str | None = None,
                    update: dict[str, Any] | None = None) -> Run:
        return await self._send(calls.retry(code, from_step, update))

    async def compensate(self, code: object, *, reason: str = "") -> Run:
        return await self._send(calls.action(code, "compensate", {"reason": reason}))

    async def resolve(self, code: object, *, note: str) -> Run:
        return await self._send(calls.action(code, "resolve", {"note": note}))

    async def retry_compensation(self, id: int) -> Run:
        return await self._send(calls.retry_compensation(id))

    # -- following a run --------------------------------------------------------------------
    async def events(self, code: object, *, last_event_id: str | None = None
                     ) -> AsyncIterator[Event]:
        follow = self._follow_state(code, last_event_id)
        async with aclosing(self._follow(follow)) as events:
            async for event in events:
                yield event

    async def _follow(self, follow: Follow) -> AsyncGenerator[Event]:
        while not follow.done:
            try:
                async with self._http.stream(**self._stream(follow)) as response:
                    if not follow.streams(response):
                        await response.aread()
                        pause = follow.refused(response)
                        if pause is not None:
                            await sleep(follow.bounded(pause))
                        continue
                    async for line in response.aiter_lines():
                        event = follow.line(line)
                        if event is not None:
                            yield event
                        if follow.done:
                            return
            except httpx.TransportError as exc:
                await sleep(follow.bounded(follow.failed(exc)))
                continue
            await sleep(follow.bounded(follow.ended()))

    async def wait(self, code: object, *, timeout: float | None = None,
                   until: Iterable[str] | None = None, poll: float = 1.0) -> RunDetail:
        wanted = calls.until_statuses(until)
        follow = self._follow_state(code, timeout=timeout)
        try:
            async with aclosing(self._follow(follow)) as events:
                async for event in events:
                    if event.status in wanted:
                        return await self.get(code)
        except (NoEventStream, ConnectionFailed):
            pass  # poll instead (where that fails too, the server is gone: raised)
        while True:
            run = await self.get(code)
            follow.status = run.status
            if run.status in wanted:
                return run
            await sleep(follow.bounded(poll))
