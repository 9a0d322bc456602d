"""What the sync and async clients share, sans I/O: each operation as a ``Call`` (what to
send, whether sending it again is safe, what to make of the answer), the retry policy, and the
state of following a run's events and of waiting for one. ``_sync`` and ``_async`` only send
and sleep."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from stateguard.client._errors import ClientError, ConnectionFailed, WaitTimeout, api_error
from stateguard.client._models import Agent, Event, Run, RunDetail, RunPage
from stateguard.client._sse import Decoder

T = TypeVar("T")

# The statuses at which a run stopped: the events stream ends there, and ``wait`` returns
# (only a person moves such a run on: a retry, a compensation, a resolution).
STOPPED = frozenset({"succeeded", "compensated", "failed", "needs_attention"})
EVENT_STREAM = "text/event-stream"
# Whether a request never reached the server: these are safe to send again whatever it does.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# A proxy's answers while no server is behind it (a restart): the request did not get through
# (503), or may have (502, 504: only requests that are safe twice are sent again).
_UNAVAILABLE = frozenset({502, 503, 504})


class NoEventStream(ClientError):
    """The server answered the events' request with something that is not an event stream
    (a server older than the endpoint, a proxy's page): ``wait`` polls instead."""


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Sending it twice does no harm (a read; a submission with its idempotency key), so it is
    # sent again after any failure that may or may not have reached the server.
    idempotent: bool = True


def run_path(code: object, action: str = "") -> str:
    path = f"/api/runs/{quote(str(code), safe='')}"
    return f"{path}/{action}" if action else path


def answer(response: httpx.Response) -> Any:
    """The JSON of a successful answer; the ``APIError`` of any other."""
    if response.is_success:
        return response.json()
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    raise api_error(response.status_code, body, retry_after=_seconds(response))


def _seconds(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None


def _run(response: httpx.Response) -> Run:
    return Run.from_json(answer(response))


def submit(agent: str, input: dict[str, Any] | None, key: str | None) -> Call[Run]:
    # A key of our own when none is given: a submission sent again after a lost answer gives
    # back the same run (the API's 200) instead of a second one.
    key = key or f"sg-client-{uuid.uuid4()}"
    return Call("POST", "/api/runs", lambda r: Run.from_json(answer(r),
                                                            replayed=r.status_code == 200),
                json={"agent": agent, "input": input or {}}, headers={"Idempotency-Key": key})


def get(code: object) -> Call[RunDetail]:
    return Call("GET", run_path(code), lambda r: RunDetail.from_json(answer(r)))


def list_runs(*, status: str | Iterable[str] | None, agent: str | None, q: str | None,
              created_after: datetime | None, created_before: datetime | None,
              sort: str | None, limit: int, offset: int) -> Call[RunPage]:
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    statuses = [status] if isinstance(status, str) else list(status or ())
    if statuses:  # any of them: ?status=failed&status=needs_attention
        params["status"] = statuses
    params.update({k: v for k, v in (("agent", agent), ("q", q), ("sort", sort)) if v})
    params.update({k: v.isoformat() for k, v in (("created_after", created_after),
                                                  ("created_before", created_before)) if v})
    return Call("GET", "/api/runs", lambda r: RunPage.from_json(answer(r)), params=params)


def agents() -> Call[list[Agent]]:
    return Call("GET", "/api/agents", lambda r: [Agent.from_json(a) for a in answer(r)])


def action(code: object, name: str, body: dict[str, Any] | None = None) -> Call[Run]:
    """An operator's action: not safe to send twice (a second approve is a 409 that hides
    that the first went through), so sent again only when it surely never arrived."""
    return Call("POST", run_path(code, name), _run, json=body, idempotent=False)


def retry(code: object, from_step: str | None, update: dict[str, Any] | None) -> Call[Run]:
    body = {"from_step": from_step, "update": update} if from_step else None
    return action(code, "retry", body)


def retry_compensation(id: int) -> Call[Run]:
    return Call("POST", f"/api/compensations/{int(id)}/retry", _run, idempotent=False)


def pending_approval(run: RunDetail) -> int:
    """The id of the run's one pending approval (approve and reject without one named)."""
    pending = run.pending_approvals
    if len(pending) != 1:
        which = ", ".join(f"{a.id} ({a.node})" for a in pending) or "none"
        raise ValueError(f"run {run.code} has {len(pending)} pending approvals ({which}): "
                         "name the one to decide")
    return pending[0].id


def decision(approval: int, reason: str) -> dict[str, Any]:
    return {"approval": approval, "reason": reason}


@dataclass(frozen=True, slots=True)
class Retry:
    """How often, and after how long, a request is sent again: ``retries`` more times, after
    ``backoff`` seconds doubling (up to ``cap``), each with jitter, or after the
    ``Retry-After`` a 503 asks for (up to a minute)."""

    retries: int = 3
    backoff: float = 0.5
    cap: float = 8.0

    def delay(self, attempt: int, asked: float | None = None) -> float:
        step = min(self.cap, self.backoff * 2.0 ** attempt)
        wait = step / 2 + random.uniform(0, step / 2)
        return max(wait, min(asked, 60.0)) if asked else wait

    def after_error(self, call: Call[Any], exc: httpx.TransportError, attempt: int) -> float:
        """The wait before sending ``call`` again after ``exc``; ``ConnectionFailed`` if
        it must not be sent again (or has been often enough)."""
        if attempt >= self.retries or not (call.idempotent or isinstance(exc, _NOT_SENT)):
            raise ConnectionFailed(f"{call.method} {call.path}: {exc!r}") from exc
        return self.delay(attempt)

    def after_response(self, call: Call[Any], response: httpx.Response,
                       attempt: int) -> float | None:
        """The wait before sending ``call`` again after ``response``; None: take it."""
        status = response.status_code
        if attempt >= self.retries or status not in _UNAVAILABLE or (
                status != 503 and not call.idempotent):
            return None
        return self.delay(attempt, _seconds(response) if status == 503 else None)


class Base:
    """What ``Client`` and ``AsyncClient`` hold apart from their httpx client: the server,
    the key, the timeouts and the retry policy, and the requests they make of them."""

    def __init__(self, *, base_url: str, api_key: str, timeout: float, retries: int,
                 backoff: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._timeout = timeout
        # A stream's reads: the server's heartbeats come more often; a longer silence is a
        # dead connection, resumed.
        self._read_timeout = max(timeout, 60.0)
        self._retry = Retry(retries=retries, backoff=backoff)

    def _request(self, call: Call[Any]) -> dict[str, Any]:
        """``call`` as httpx's ``request`` arguments."""
        return {"method": call.method, "url": self.base_url + call.path, "json": call.json,
                "params": call.params, "headers": {**self._auth, **call.headers},
                "timeout": self._timeout}

    def _follow_state(self, code: object, last_event_id: str | None = None,
                      timeout: float | None = None) -> Follow:
        return Follow(code, last_event_id, self._retry, read_timeout=self._read_timeout,
                      deadline=deadline(timeout))

    def _stream(self, follow: Follow) -> dict[str, Any]:
        """The events' request, as httpx's ``stream`` arguments."""
        return {"method": "GET", "url": self.base_url + follow.path,
                "headers": {**self._auth, **follow.headers()},
                "timeout": follow.timeout(self._timeout)}


class Follow:
    """One ``events`` iteration across the connections it makes: the last id (sent as
    ``Last-Event-ID`` on each reconnection), whether the run stopped, the failures in a row.
    ``deadline`` (``time.monotonic()``): when ``wait`` gives up (``WaitTimeout``)."""

    def __init__(self, code: object, last_event_id: str | None, retry: Retry, *,
                 read_timeout: float, deadline: float | None = None) -> None:
        self.code = str(code)
        self.path = run_path(code, "events")
        self.decoder = Decoder(last_event_id or "")
        self.retry = retry
        self.read_timeout = read_timeout
        self.deadline = deadline
        self.timeout_given = 0.0 if deadline is None else deadline - time.monotonic()
        self.failures = 0
        self.done = False
        self.status: str | None = None

    def headers(self) -> dict[str, str]:
        last = self.decoder.last_id
        return {"Accept": EVENT_STREAM, **({"Last-Event-ID": last} if last else {})}

    def timeout(self, connect: float) -> httpx.Timeout:
        """Reads wait at most ``read_timeout`` (the server's heartbeats come more often: a
        longer silence is a dead connection) or until the deadline."""
        read = self.read_timeout
        if self.deadline is not None:
            read = max(0.05, min(read, self.deadline - time.monotonic()))
        return httpx.Timeout(connect, read=read)

    def streams(self, response: httpx.Response) -> bool:
        """Whether ``response`` is the event stream, to read line by line; if not, read its
        body and ask ``refused``."""
        ok = response.status_code == 200 and response.headers.get(
            "content-type", "").startswith(EVENT_STREAM)
        if ok:
            self.failures = 0
        return ok

    def refused(self, response: httpx.Response) -> float | None:
        """An answer that is no stream (its body read): None once the run stopped and every
        event was read (204: the end); else the wait before reconnecting after a proxy's
        502/503/504. Any other is raised: the API's error, or ``NoEventStream``."""
        status = response.status_code
        if status == 204:
            self.done = True
            return None
        if status in _UNAVAILABLE:
            return self._failed(ConnectionFailed(f"GET {self.path}: {status}"))
        if response.is_success:
            raise NoEventStream(f"GET {self.path}: {response.headers.get('content-type')}")
        try:
            answer(response)
        except ClientError as exc:
            if getattr(exc, "code", None) is None:  # not the API's answer: a proxy's page...
                raise NoEventStream(str(exc)) from exc
            raise
        raise NoEventStream(f"GET {self.path}: {status}")  # pragma: no cover - not a success

    def line(self, text: str) -> Event | None:
        """The event a line of the stream completes, if any."""
        self.check_deadline()
        message = self.decoder.line(text)
        if message is None or message.event == "message":
            return None
        event = Event.from_json(message.id, json.loads(message.data))
        if event.status is not None:
            self.status = event.status
            self.done = event.status in STOPPED
        return event

    def failed(self, exc: httpx.TransportError) -> float:
        """The wait before reconnecting after ``exc`` (a read timeout, a dropped
        connection); ``ConnectionFailed`` after too many in a row."""
        self.check_deadline()
        return self._failed(exc)

    def _failed(self, exc: Exception) -> float:
        self.failures += 1
        if self.failures > self.retry.retries:
            raise ConnectionFailed(f"GET {self.path}: {exc!r}") from exc
        return self.retry.delay(self.failures - 1)

    def ended(self) -> float:
        """The stream ended before the run stopped (a WSGI server answers what there is now,
        with ``retry``): the wait before reconnecting."""
        return (self.decoder.retry if self.decoder.retry is not None else 1000) / 1000

    def bounded(self, pause: float) -> float:
        """``pause``, cut at the deadline (past it: ``WaitTimeout``)."""
        self.check_deadline()
        return pause if self.deadline is None else min(pause, self.deadline - time.monotonic())

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise WaitTimeout(self.code, self.timeout_given, self.status)


def until_statuses(until: Iterable[str] | None) -> frozenset[str]:
    return STOPPED if until is None else frozenset(str(s) for s in until)


def deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout
