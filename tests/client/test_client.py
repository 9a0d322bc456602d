"""``stateguard.client`` against ``httpx.MockTransport``: what it sends again, and what not;
the idempotency key a submission keeps across its retries; the API's errors as exceptions;
following events across a cut connection; ``wait`` with and without an event stream.

The server side, end to end, is tests/web/api/test_client_stack.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import stateguard.client
from stateguard.client import (
    AsyncClient,
    Client,
    ConnectionFailed,
    IdempotencyConflict,
    InvalidRequest,
    NotAllowedNow,
    NotAuthenticated,
    NotFound,
    ServerError,
    Throttled,
    WaitTimeout,
    _async,
    _sync,
)

CODE = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
URL = "http://sg.test"
Handler = Callable[[httpx.Request], httpx.Response]


def run_json(status: str = "pending", **extra: Any) -> dict[str, Any]:
    return {"code": CODE, "agent": "checkout", "status": status, "input": {"amount": 4200},
            "error": None, "submitted_by": "shop", "created_at": "2026-05-01T12:00:00Z",
            "updated_at": "2026-05-01T12:00:01Z", "request": None, **extra}


def detail_json(status: str = "pending", **extra: Any) -> dict[str, Any]:
    return run_json(status, **{"steps": [], "compensations": [], "effects": [],
                               "approvals": [], "violated_invariant": None, "audit": [],
                               **extra})


def error(status: int, code: str, detail: str = "no", **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"detail": detail, "code": code}, headers=headers)


def sse(*events: tuple[str, str, dict[str, Any]], retry: int | None = None) -> bytes:
    """An event stream: (id, type, data) each, as the server frames them."""
    text = f"retry: {retry}\n\n" if retry is not None else ""
    for id, type, data in events:
        event = {"type": type, "run": CODE, "node": data.pop("node", None), "step_id": None,
                 "data": data, "at": 1777636800.5}
        text += f"id: {id}\nevent: {type}\ndata: {json.dumps(event)}\n\n"
    return text.encode()


def stream(body: bytes | Iterator[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)


class Recorder:
    """A MockTransport's handler that answers from ``answers`` in turn (a callable answers
    each request it gets from then on) and keeps each request."""

    def __init__(self, *answers: httpx.Response | Exception | Handler) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[0] if callable(self.answers[0]) else self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer) and not isinstance(answer, httpx.Response):
            return answer(request)
        return answer

    def client(self, **options: Any) -> Client:
        options.setdefault("backoff", 0.0)
        return Client(base_url=URL, api_key="sg_key", http=httpx.Client(
            transport=httpx.MockTransport(self)), **options)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's sleeps, recorded instead of slept: its module's own ``sleep``, not
    ``time.sleep``, which every thread of the process shares (a heartbeat thread left by
    another test would spin, filling the list)."""
    waits: list[float] = []
    monkeypatch.setattr(_sync, "sleep", waits.append)
    return waits


def test_it_sends_a_submission_again_with_the_same_key_until_it_is_answered(
        slept: list[float]) -> None:
    calls = Recorder(httpx.ConnectError("refused"), httpx.ReadError("reset by peer"),
                     error(503, "unavailable", **{"Retry-After": "2"}),
                     httpx.Response(200, json=run_json()))
    run = calls.client(backoff=0.5).submit("checkout", {"amount": 4200})

    assert (run.code, run.status, run.replayed) == (CODE, "pending", True)
    keys = {r.headers["Idempotency-Key"] for r in calls.requests}
    assert len(calls.requests) == 4 and len(keys) == 1 and keys.pop().startswith("sg-client-")
    assert [json.loads(r.content) for r in calls.requests] == [
        {"agent": "checkout", "input": {"amount": 4200}}] * 4
    assert all(r.headers["Authorization"] == "Bearer sg_key" for r in calls.requests)
    # Backing off: 0.25-0.5 s, then 0.5-1 s, then what the 503 asked (2 s) over 1-2 s.
    assert 0.25 <= slept[0] <= 0.5 and 0.5 <= slept[1] <= 1.0 and slept[2] == 2.0


def test_it_keeps_the_key_it_is_given_and_says_a_new_run_is_new(slept: list[float]) -> None:
    calls = Recorder(httpx.Response(201, json=run_json()))
    run = calls.client().submit("checkout", {"amount": 4200}, idempotency_key="order-42")
    assert run.replayed is False
    assert calls.requests[0].headers["Idempotency-Key"] == "order-42"


def test_it_gives_up_after_its_retries(slept: list[float]) -> None:
    calls = Recorder(lambda request: error(502, "bad_gateway"))
    with pytest.raises(ServerError) as raised:
        calls.client(retries=2).get(CODE)
    assert len(calls.requests) == 3 and raised.value.status == 502
    calls = Recorder(*[httpx.ConnectError("refused")] * 3)
    with pytest.raises(ConnectionFailed):
        calls.client(retries=2).get(CODE)
    assert len(calls.requests) == 3


def test_it_sends_an_operator_action_again_only_when_it_surely_never_arrived(
        slept: list[float]) -> None:
    # Never connected, and a proxy with no server behind it (503): sent again.
    calls = Recorder(httpx.ConnectError("refused"), error(503, "unavailable"),
                     httpx.Response(202, json=run_json("paused")))
    assert calls.client().approve(CODE, 7, reason="ok").status == "paused"
    assert len(calls.requests) == 3
    assert json.loads(calls.requests[-1].content) == {"approval": 7, "reason": "ok"}
    # The connection broke after the request went out: it may have been approved; asking
    # again would get a 409 that hides it. The caller is told instead.
    calls = Recorder(httpx.ReadError("reset"), httpx.Response(202, json=run_json()))
    with pytest.raises(ConnectionFailed):
        calls.client().approve(CODE, 7)
    assert len(calls.requests) == 1
    calls = Recorder(error(504, "timeout"), httpx.Response(202, json=run_json()))
    with pytest.raises(ServerError):
        calls.client().compensate(CODE, reason="outage")
    assert len(calls.requests) == 1


@pytest.mark.parametrize(("answer", "kind", "code"), [
    (error(401, "not_authenticated", "API key revoked"), NotAuthenticated, "not_authenticated"),
    (error(404, "not_found"), NotFound, "not_found"),
    (error(409, "not_allowed_now", "run is running"), NotAllowedNow, "not_allowed_now"),
    (error(422, "idempotency_conflict"), IdempotencyConflict, "idempotency_conflict"),
    (error(422, "invalid"), InvalidRequest, "invalid"),
    (httpx.Response(431, text="<h1>Request Header Fields Too Large</h1>"),
     stateguard.client.APIError, None),
])
def test_it_raises_the_apis_errors_with_their_code_and_status(
        answer: httpx.Response, kind: type[Exception], code: str | None) -> None:
    with pytest.raises(kind) as raised:
        Recorder(answer).client().retry(CODE)
    assert isinstance(raised.value, stateguard.client.APIError)
    assert (raised.value.code, raised.value.status) == (code, answer.status_code)


def test_it_says_how_long_a_throttled_client_must_wait() -> None:
    with pytest.raises(Throttled) as raised:
        Recorder(error(429, "throttled", **{"Retry-After": "840"})).client().get(CODE)
    assert raised.value.retry_after == 840.0


def test_it_decides_the_runs_one_pending_approval_when_none_is_named() -> None:
    approval = {"id": 12, "node": "charge_user", "step_id": "t1", "payload": None,
                "status": "pending", "decided_by": None, "reason": "",
                "requested_at": "2026-05-01T12:00:00Z", "decided_at": None}
    calls = Recorder(httpx.Response(200, json=detail_json("paused", approvals=[approval])),
                     httpx.Response(202, json=run_json("paused")))
    calls.client().reject(CODE, reason="fraud")
    assert json.loads(calls.requests[1].content) == {"approval": 12, "reason": "fraud"}
    with pytest.raises(ValueError, match="0 pending approvals"):
        Recorder(httpx.Response(200, json=detail_json("running"))).client().approve(CODE)


def test_it_reads_what_the_ledger_can_vouch_for_of_each_effect() -> None:
    charge = {"provider": "stripe", "kind": "charge", "external_id": "pi_1", "amount": 4200,
              "currency": "usd", "status": "applied", "state": "in_doubt", "undoes": None,
              "node": "charge_user", "step_id": "t1", "recorded_at": "2026-05-01T12:00:00Z"}
    older = {k: v for k, v in charge.items() if k not in ("state", "step_id")}
    calls = Recorder(httpx.Response(200, json=detail_json("needs_attention",
                                                          effects=[charge, older])))

    run = calls.client().get(CODE)

    assert [(e.status, e.state) for e in run.effects] == [("applied", "in_doubt"),
                                                          ("applied", "applied")]


def test_it_lists_several_statuses_in_an_order() -> None:
    page = {"items": [run_json("failed")], "count": 1}
    calls = Recorder(lambda request: httpx.Response(200, json=page))
    sg = calls.client()
    assert sg.list(status=["failed", "needs_attention"], sort="-duration").count == 1
    sg.list(status="failed")
    several, one = (request.url.params for request in calls.requests)
    assert several.get_list("status") == ["failed", "needs_attention"]
    assert several["sort"] == "-duration" and several["limit"] == "50"
    assert one.get_list("status") == ["failed"] and "sort" not in one


def cut_after(body: bytes) -> Iterator[bytes]:
    yield body
    raise httpx.ReadError("connection reset")


def test_it_resumes_a_cut_stream_after_the_last_event_it_read(slept: list[float]) -> None:
    calls = Recorder(
        stream(cut_after(sse(("id-1", "run.status", {"status": "running"}),
                             ("id-2", "step.started", {"node": "charge"})))),
        stream(sse(("id-3", "step.succeeded", {"node": "charge"}), retry=2000)),  # then ends
        stream(sse(("id-4", "run.status", {"status": "compensated"}))),
    )
    events = list(calls.client().events(CODE))

    assert [(e.id, e.type, e.node) for e in events] == [
        ("id-1", "run.status", None), ("id-2", "step.started", "charge"),
        ("id-3", "step.succeeded", "charge"), ("id-4", "run.status", None)]
    assert [r.headers.get("Last-Event-ID") for r in calls.requests] == [None, "id-2", "id-3"]
    assert events[-1].status == "compensated" and events[0].at.year == 2026
    assert slept[1] == 2.0  # the stream that ended said when to come back


def test_it_stops_when_the_server_has_nothing_more() -> None:
    calls = Recorder(httpx.Response(204))
    assert list(calls.client().events(CODE, last_event_id="id-9")) == []
    assert calls.requests[0].headers["Last-Event-ID"] == "id-9"


def test_it_waits_for_the_run_to_stop_through_its_events() -> None:
    calls = Recorder(stream(sse(("a", "run.status", {"status": "running"}),
                                ("b", "run.status", {"status": "compensated"}))),
                     httpx.Response(200, json=detail_json("compensated")))
    done = calls.client().wait(CODE, timeout=5)
    assert done.status == "compensated" and done.steps == []
    assert [r.url.path for r in calls.requests] == [f"/api/runs/{CODE}/events",
                                                    f"/api/runs/{CODE}"]


def test_it_polls_a_server_without_an_event_stream(slept: list[float]) -> None:
    statuses = iter(["running", "running", "succeeded"])
    calls = Recorder(httpx.Response(404, text="<h1>Not Found</h1>"),
                     lambda request: httpx.Response(200, json=detail_json(next(statuses))))
    assert calls.client().wait(CODE, poll=0.5).status == "succeeded"
    assert len(calls.requests) == 4 and slept == [0.5, 0.5]


def test_it_gives_up_waiting_after_the_timeout() -> None:
    calls = Recorder(lambda request: stream(sse(("a", "run.status", {"status": "paused"}))))
    with pytest.raises(WaitTimeout) as raised:
        calls.client().wait(CODE, timeout=0.3)
    assert raised.value.status == "paused" and isinstance(raised.value, TimeoutError)


def test_it_raises_an_auth_error_from_the_events_too() -> None:
    with pytest.raises(NotAuthenticated):
        Recorder(error(401, "not_authenticated")).client().wait(CODE)


class AsyncRecorder(Recorder):
    def aclient(self, **options: Any) -> AsyncClient:
        options.setdefault("backoff", 0.0)

        async def handle(request: httpx.Request) -> httpx.Response:
            await request.aread()
            return self(request)

        return AsyncClient(base_url=URL, api_key="sg_key", http=httpx.AsyncClient(
            transport=httpx.MockTransport(handle)), **options)


async def test_the_async_twin_retries_and_follows_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(seconds: float) -> None:
        pass

    monkeypatch.setattr(_async, "sleep", no_sleep)
    calls = AsyncRecorder(httpx.ConnectError("refused"), httpx.Response(201, json=run_json()),
                          stream(sse(("x", "run.status", {"status": "running"}))),
                          stream(sse(("y", "run.status", {"status": "succeeded"}))),
                          httpx.Response(200, json=detail_json("succeeded")))
    async with calls.aclient() as sg:
        run = await sg.submit("checkout", {"amount": 1})
        done = await sg.wait(run.code)
    assert done.status == "succeeded"
    first, second = calls.requests[:2]
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert calls.requests[3].headers["Last-Event-ID"] == "x"


def test_it_exports_exactly_its_documented_names_sorted() -> None:
    names = stateguard.client.__all__
    assert names == sorted(names)
    documented = stateguard.client.__doc__ or ""
    errors = [n for n in names if isinstance(getattr(stateguard.client, n), type)
              and issubclass(getattr(stateguard.client, n), Exception)]
    assert len(errors) == 12 and all(n in documented for n in errors)


def test_it_imports_no_web_framework() -> None:
    code = ("import sys, stateguard.client; "
            "print(sorted(m for m in ('django', 'celery', 'channels') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
