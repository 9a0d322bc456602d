"""GET /api/runs/{code}/events: the run's journal as Server-Sent Events, with ids a client
resumes from (runs/journal_events.py), for whoever may read the run.

Through Django's test client (WSGI: the answer is what the journal holds now, with
``retry``) and, for the live stream, its async client (ASGI: streamed until the run stops).
Against Daphne, gunicorn and real workers: tests/web/api/test_client_stack.py."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from stateguard.client._sse import Decoder
from stateguard_web.accounts import services as accounts
from stateguard_web.runs.journal_events import MAX_SEEN, WINDOW, Cursor, Fact
from stateguard_web.sagas import events as live
from stateguard_web.sagas.models import Approval, Compensation, Run, Step
from tests.web.api.world import World, make_user


def parse(body: bytes) -> tuple[list[tuple[str, dict[str, Any]]], int | None]:
    """The events of an answer (id, event), and the ``retry`` it asked for."""
    decoder, found = Decoder(), []
    for line in body.decode().splitlines():
        message = decoder.line(line)
        if message is not None:
            found.append((message.id, json.loads(message.data)))
    return found, decoder.retry


def kinds(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str | None]]:
    return [(e["type"], e["node"] or e["data"].get("status")) for _, e in events]


class EventsTests(World):
    def setUp(self) -> None:
        # A run that compensated: create_customer succeeded, charge_user failed; the undo of
        # create_customer failed once, then worked.
        self.t0 = t0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
        self.run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATED,
                                      submitted_by=self.alice, input={"amount": 1})
        self.customer = self.step("create_customer", 1, 2)
        self.step("charge_user", 3, 4, Step.Status.FAILED,
                  error={"type": "CardError", "message": "declined", "traceback": ""})
        undo = Compensation.objects.create(run=self.run, step=self.customer,
                                           node="create_customer", idempotency_key="k-c",
                                           status=Compensation.Status.SUCCEEDED)
        for number, ok in ((1, False), (2, True)):
            at = t0 + timedelta(seconds=4 + number)
            undo.attempts.create(number=number, started_at=at, finished_at=at, ok=ok,
                                 error=None if ok else {"type": "APIConnectionError",
                                                        "message": "down", "traceback": ""})
        Compensation.objects.filter(pk=undo.pk).update(updated_at=t0 + timedelta(seconds=7))
        self.path = f"/api/runs/{self.run.code}/events"

    def step(self, node: str, start: float, end: float | None,
             status: str = Step.Status.SUCCEEDED, **extra: Any) -> Step:
        return Step.objects.create(
            run=self.run, step_id=f"t-{node}", node=node, status=status,
            started_at=self.t0 + timedelta(seconds=start),
            finished_at=None if end is None else self.t0 + timedelta(seconds=end), **extra)

    def read(self, last_event_id: str | None = None, who: str = "vera"
             ) -> tuple[list[tuple[str, dict[str, Any]]], Any]:
        headers = {"HTTP_LAST_EVENT_ID": last_event_id} if last_event_id else {}
        response = self.call(who, "GET", self.path, **headers)
        assert response.status_code == 200, response.content
        return parse(response.content)[0], response

    def test_it_sends_the_journals_facts_oldest_first_then_the_status(self) -> None:
        events, response = self.read()

        assert response["Content-Type"] == "text/event-stream"
        assert (response["Cache-Control"], response["X-Accel-Buffering"]) == ("no-cache", "no")
        assert parse(response.content)[1] == 10_000  # WSGI: come back in the poll period
        assert kinds(events) == [
            ("step.started", "create_customer"), ("step.succeeded", "create_customer"),
            ("step.started", "charge_user"), ("step.failed", "charge_user"),
            ("compensation.attempt", "create_customer"),
            ("compensation.attempt", "create_customer"),
            ("compensation.succeeded", "create_customer"), ("run.status", "compensated")]
        failed, attempt = events[3][1], events[4][1]
        assert (failed["run"], failed["step_id"], failed["data"]) == (
            str(self.run.code), "t-charge_user", {"attempt": 1, "error": "CardError: declined"})
        assert failed["at"] == (self.t0 + timedelta(seconds=4)).timestamp()
        assert attempt["data"]["ok"] is False and attempt["data"]["attempt"] == 1
        assert events[6][1]["data"]["attempts"] == 2
        assert len({id for id, _ in events}) == len(events)  # each id its own

    def test_it_resumes_after_an_id_with_exactly_what_came_since(self) -> None:
        everything, _ = self.read()
        # A client read three events, then its connection was cut. Meanwhile an operator
        # retried the failed charge: it ran again (its second attempt) and succeeded.
        Step.objects.filter(step_id="t-charge_user").update(
            attempt=2, status=Step.Status.SUCCEEDED, error=None,
            started_at=self.t0 + timedelta(seconds=8), finished_at=self.t0 + timedelta(seconds=9))
        Run.objects.filter(pk=self.run.pk).update(status=Run.Status.SUCCEEDED)

        resumed, _ = self.read(everything[2][0])

        # What followed the third event, minus the charge's first attempt (no longer in the
        # journal), plus its second attempt and the new status: nothing twice.
        assert kinds(resumed) == [
            *kinds(everything[4:7]), ("step.started", "charge_user"),
            ("step.succeeded", "charge_user"), ("run.status", "succeeded")]
        assert resumed[-2][1]["data"] == {"attempt": 2}
        assert not {id for id, _ in resumed} & {id for id, _ in everything[:3]}
        # From the last id: nothing more, and the run stopped: the end.
        again = self.call("vera", "GET", self.path, HTTP_LAST_EVENT_ID=resumed[-1][0])
        assert again.status_code == 204

    def test_it_still_sends_a_fact_that_became_visible_after_a_newer_one(self) -> None:
        events, _ = self.read()
        last = events[-1][0]
        # Two steps that ran at once: one's row committed after the newest fact was sent
        # (within the window), the other's long after (more than WINDOW older than it).
        self.step("send_receipt", 6.5, 6.9)
        self.step("ancient", 7 - WINDOW / 1e6 - 1, None)

        resumed, _ = self.read(last)
        assert kinds(resumed) == [("step.started", "send_receipt"),
                                  ("step.succeeded", "send_receipt")]

    def test_it_answers_204_once_a_stopped_run_has_nothing_more(self) -> None:
        events, _ = self.read()
        response = self.call("vera", "GET", self.path, HTTP_LAST_EVENT_ID=events[-1][0])
        assert (response.status_code, response.content) == (204, b"")
        # A run that goes on answers what it has, however little.
        Run.objects.filter(pk=self.run.pk).update(status=Run.Status.PAUSED)
        paused, _ = self.read(events[-1][0])
        assert kinds(paused) == [("run.status", "paused")]

    def test_it_sends_approvals_as_they_are_asked_for_and_decided(self) -> None:
        events, _ = self.read(who="alice")  # her own run
        Approval.objects.create(run=self.run, step_id="t-gate", node="charge_user",
                                requested_at=self.t0 + timedelta(seconds=10),
                                payload={"amount": 1}, status=Approval.Status.REJECTED,
                                decided_by="charlie", reason="fraud",
                                decided_at=self.t0 + timedelta(seconds=11))
        resumed, _ = self.read(events[-1][0])
        assert [e["type"] for _, e in resumed] == ["approval.requested", "approval.decided"]
        assert resumed[1][1]["data"]["decision"] == "rejected"
        assert resumed[1][1]["data"]["by"] == "charlie"

    def test_it_is_refused_as_the_runs_detail_is(self) -> None:
        assert self.call("anonymous", "GET", self.path).status_code == 401
        assert self.call("revoked", "GET", self.path).json()["code"] == "not_authenticated"
        assert self.call("bob", "GET", self.path).status_code == 404  # not his run
        assert self.call("vera", "GET", f"/api/runs/{uuid.uuid4()}/events").status_code == 404
        for bad in ("1.2.3", "not-an-id", "1.0.unknown_status.", "1.0.running.abc", "x" * 701):
            refused = self.call("vera", "GET", self.path, HTTP_LAST_EVENT_ID=bad)
            assert refused.status_code == 422, bad
            assert refused.json()["errors"][0]["loc"] == ["header", "Last-Event-ID"]

    def test_it_reads_the_journal_in_a_few_queries(self) -> None:
        self.read()  # the key, cached
        # The key's user, the run, then the run once more, its steps, approvals and
        # compensations (with their attempts): each an index range of the run's rows.
        with self.assertNumQueries(6):
            self.read()

    def test_it_is_documented_in_the_openapi_schema(self) -> None:
        schema = self.call("anonymous", "GET", "/api/openapi.json").json()
        operation = schema["paths"]["/api/runs/{code}/events"]["get"]
        assert operation["operationId"] == "run_events"
        assert "text/event-stream" in operation["responses"]["200"]["content"]
        assert {"204", "401", "404", "422"} <= set(operation["responses"])
        assert [p["name"] for p in operation["parameters"]] == ["code", "Last-Event-ID"]


def fact(at: int, key: str) -> Fact:
    return Fact(at, key, {})


def test_an_id_stays_short_however_many_facts_were_sent() -> None:
    cursor = Cursor()
    burst = [fact(1_000_000 + i, f"s:{i}:1:started") for i in range(500)]  # 500 in 0.5 ms
    for sent in cursor.new(burst):
        cursor.sent(sent)
    id = cursor.id()
    assert len(id) < 20 + MAX_SEEN * 8 and len(Cursor.parse(id).seen) == MAX_SEEN
    # It resumes after the newest MAX_SEEN: the older ones count as sent.
    assert Cursor.parse(id).new(burst) == []
    assert Cursor.parse(id).new([*burst, fact(2_000_000, "new")]) == [fact(2_000_000, "new")]


# -- live, under ASGI ----------------------------------------------------------------------

@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live-update publisher of its own, on this test's channel layer."""
    monkeypatch.setattr(live, "_publisher", live._Publisher())


async def follow(status: str) -> tuple[Run, AsyncIterator[bytes]]:
    """A run in ``status`` (committed: the stream reads on threads of its own), and its stream
    as a viewer reads it through Django's ASGI request (the streamed kind)."""

    def world() -> tuple[Run, str]:
        user = make_user("vera", "viewer")
        run = Run.objects.create(agent="checkout", status=status, input={})
        return run, accounts.api_key_create(user=user, name="vera")[1]

    run, key = await sync_to_async(world)()
    response = await AsyncClient().get(f"/api/runs/{run.code}/events",
                                       headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200 and response.streaming
    return run, aiter(response.streaming_content)


@pytest.mark.django_db(transaction=True)
async def test_it_streams_each_change_as_it_is_published_until_the_run_stops(
        settings: Any, publisher: None) -> None:
    # Polls rarely: what comes sooner came through the run's group (the bell).
    settings.STATEGUARD_EVENTS_POLL_SECONDS = 30
    settings.STATEGUARD_EVENTS_HEARTBEAT_SECONDS = 0.5
    run, chunks = await follow(Run.Status.RUNNING)
    first = await anext(chunks)
    assert parse(first)[1] == 1000 and kinds(parse(first)[0]) == [("run.status", "running")]
    assert await asyncio.wait_for(anext(chunks), 5) == b": heartbeat\n\n"

    def worker() -> None:  # a step runs, and the run succeeds
        now = datetime.now().astimezone()
        Step.objects.create(run=run, step_id="t-1", node="book_order", started_at=now,
                            finished_at=now, status=Step.Status.SUCCEEDED)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
        live.publish_change(run.code, "run.status", status="succeeded")

    started = time.monotonic()
    await sync_to_async(worker)()
    got = b""
    async for chunk in chunks:  # until the stream ends: the run stopped
        if not chunk.startswith(b":"):
            got += chunk
        assert time.monotonic() - started < 10
    assert time.monotonic() - started < 3  # the bell, not the 30 s poll
    assert kinds(parse(got)[0]) == [("step.started", "book_order"),
                                    ("step.succeeded", "book_order"), ("run.status", "succeeded")]


@pytest.mark.django_db(transaction=True)
async def test_it_finds_a_change_whose_live_update_was_lost(settings: Any) -> None:
    # No update is published (Redis dropped it): the stream's poll finds that the journal
    # changed, in one query, and reads it.
    settings.STATEGUARD_EVENTS_POLL_SECONDS = 0.2
    run, chunks = await follow(Run.Status.PAUSED)
    assert kinds(parse(await anext(chunks))[0]) == [("run.status", "paused")]

    def decided() -> None:
        now = datetime.now(UTC)
        Approval.objects.create(run=run, step_id="t-gate", node="charge_user",
                                requested_at=now, status=Approval.Status.REJECTED,
                                decided_by="charlie", decided_at=now)

    await sync_to_async(decided)()
    got = parse(await asyncio.wait_for(anext(chunks), 5))[0]
    assert kinds(got) == [("approval.requested", "charge_user"),
                          ("approval.decided", "charge_user")]
    await sync_to_async(Run.objects.filter(pk=run.pk).update)(status=Run.Status.FAILED)
    assert kinds(parse(await asyncio.wait_for(anext(chunks), 5))[0]) == [
        ("run.status", "failed")]
    assert [chunk async for chunk in chunks] == []  # the end: the run stopped
