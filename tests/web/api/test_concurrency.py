"""Concurrent HTTP requests against a live server on PostgreSQL: twenty submissions with one
idempotency key make one run; of twenty approvals of one step one is accepted and the step
runs once when a worker carries the decision out."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import LiveServerTestCase

from stateguard_web.accounts import services as accounts
from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import AuditEvent, Run
from tests.web.api.world import make_user

N = 20


def in_parallel(n: int, call: Callable[[], tuple[int, Any]]) -> list[tuple[int, Any]]:
    """``call()`` from ``n`` threads released at once; their results."""
    start = threading.Barrier(n)
    results: list[tuple[int, Any]] = []

    def go() -> None:
        start.wait()
        results.append(call())

    threads = [threading.Thread(target=go) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == n
    return results


class ConcurrentRequestTests(LiveServerTestCase):
    @pytest.fixture(autouse=True)
    def _stripe(self, localstripe_url: str) -> Iterator[None]:
        with self.settings(STRIPE_API_BASE=localstripe_url):
            yield

    def setUp(self) -> None:
        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # no task from earlier
        self.alice = make_user("alice", "submitter")
        self.charlie = make_user("charlie", "operator")
        self.alice_key = accounts.api_key_create(user=self.alice, name="shop")[1]
        self.charlie_key = accounts.api_key_create(user=self.charlie, name="ops")[1]

    def post(self, path: str, body: Any, key: str, **headers: str) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.live_server_url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                     **headers})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def test_it_makes_one_run_of_twenty_concurrent_submissions_with_one_key(self) -> None:
        body = {"agent": "provision", "input": {"name": "web-1"}}
        results = in_parallel(N, lambda: self.post("/api/runs", body, self.alice_key,
                                                   **{"Idempotency-Key": "order-42"}))
        assert sorted(status for status, _ in results) == [200] * (N - 1) + [201], results
        assert len({answer["code"] for _, answer in results}) == 1
        assert Run.objects.count() == 1
        assert AuditEvent.objects.filter(action="run.submitted").count() == 1
        # The same key with another body is refused, and makes nothing.
        other = {"agent": "provision", "input": {"name": "web-2"}}
        status, answer = self.post("/api/runs", other, self.alice_key,
                                   **{"Idempotency-Key": "order-42"})
        assert (status, answer["code"]) == (422, "idempotency_conflict")
        assert Run.objects.count() == 1

    def test_it_accepts_one_of_twenty_concurrent_approvals_and_runs_the_step_once(self) -> None:
        run = services.run_submit(agent="checkout", by=self.alice,
                                  input={"email": "a@b.co", "amount": 25000})
        tasks.run_execute(run.pk)  # as a worker would: above 100.00 the charge waits
        run.refresh_from_db()
        assert run.status == Run.Status.PAUSED
        approval = run.approvals.get()

        results = in_parallel(N, lambda: self.post(f"/api/runs/{run.code}/approve",
                                                   {"approval": approval.pk},
                                                   self.charlie_key))
        statuses = sorted(status for status, _ in results)
        assert statuses == [202] + [409] * (N - 1), results
        assert {answer["code"] for status, answer in results if status == 409} == {
            "not_allowed_now"}

        run.refresh_from_db()
        request_id = run.request["id"]
        tasks.run_request(run.pk, request_id)  # the worker carries the decision out
        tasks.run_request(run.pk, request_id)  # and the broker delivers it twice
        run.refresh_from_db()
        assert run.status == Run.Status.SUCCEEDED
        (charge,) = run.steps.filter(node="charge_user")
        assert charge.attempt == 1 and charge.prev_status is None  # its body ran once
        decisions = AuditEvent.objects.filter(run=run, action="run.approved")
        assert [(e.actor, e.data["via"]) for e in decisions] == [
            ("charlie", f"key {self.charlie_key[:11]}")]
