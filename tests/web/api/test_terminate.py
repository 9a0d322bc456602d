"""``POST /api/runs/{code}/terminate``: stop a run now, then unwind or hold it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone

from stateguard_web.sagas.models import AuditEvent, Run
from tests.web.api.world import World, journal_state


class TerminateApiTests(World):
    def setUp(self) -> None:
        self.running = Run.objects.create(
            agent="provision", status=Run.Status.RUNNING, submitted_by=self.alice,
            input={"name": "web-9"}, lease_owner="w1:1:abc",
            lease_expires_at=timezone.now() + timedelta(seconds=30))

    def terminate(self, run: Run, body: Any, who: str = "charlie") -> Any:
        return self.call(who, "POST", f"/api/runs/{run.code}/terminate", body)

    def test_it_asks_the_worker_running_the_run_to_stop(self) -> None:
        response = self.terminate(self.running, {"then": "unwind", "reason": "wrong name"})
        assert response.status_code == 202, response.content
        run = response.json()
        assert run["status"] == "running"  # until the worker stops it
        assert (run["request"]["action"], run["request"]["by"]) == ("terminate", "charlie")
        event = AuditEvent.objects.get(run=self.running)
        assert (event.action, event.actor) == ("run.terminate_requested", "charlie")
        assert {k: event.data[k] for k in ("then", "reason")} == {"then": "unwind",
                                                                  "reason": "wrong name"}
        # One request at a time: a second is refused until a worker carried it out.
        response = self.terminate(self.running, {"then": "hold"})
        assert response.status_code == 409
        assert "(terminate by charlie)" in response.json()["detail"]

    def test_it_cancels_a_pending_run_at_once(self) -> None:
        pending = Run.objects.create(agent="provision", submitted_by=self.alice,
                                     input={"name": "web-8"})
        response = self.terminate(pending, {"then": "hold", "reason": "duplicate order"})
        assert response.status_code == 200, response.content
        assert response.json()["status"] == "needs_attention"
        assert response.json()["request"] is None

    def test_it_says_why_it_does_not_apply(self) -> None:
        for run, detail in [(self.paused, "is paused; only a pending or running run is "
                                          "terminated (compensate a paused or failed one)"),
                            (self.stuck, "is needs_attention; only a pending or running")]:
            with self.subTest(status=run.status):
                response = self.terminate(run, {"then": "unwind"})
                assert (response.status_code, response.json()["code"]) == (409,
                                                                           "not_allowed_now")
                assert detail in response.json()["detail"]

    def test_a_bad_body_is_a_clear_4xx_and_changes_nothing(self) -> None:
        for body, status, loc in [
                (None, 422, None), ({}, 422, ["body", "then"]),
                ({"then": "stop"}, 422, ["body", "then"]),
                ({"then": "hold", "reason": "a\x00b"}, 422, ["body", "reason"]),
                ({"then": "hold", "reason": "x" * 2001}, 422, ["body", "reason"]),
                ({"then": "hold", "force": True}, 422, ["body", "force"]),
                ({"then": ["unwind"]}, 422, ["body", "then"]),
                ("{not json", 400, None), ("[" * 100_000, 400, None)]:
            with self.subTest(body=str(body)[:30]):
                before = journal_state()
                response = self.terminate(self.running, body)
                assert response.status_code == status, response.content
                data = response.json()
                assert data["detail"] and data["code"] in ("invalid", "malformed_json")
                if loc is not None:
                    assert loc in [e["loc"] for e in data["errors"]], data
                assert journal_state() == before
        assert self.call("charlie", "POST", "/api/runs/not-a-uuid/terminate",
                         {"then": "hold"}).status_code == 422
        assert self.call("charlie", "POST",
                         "/api/runs/00000000-0000-4000-8000-000000000000/terminate",
                         {"then": "hold"}).status_code == 404

    def test_only_operators_may(self) -> None:
        for who, status in [("vera", 403), ("alice", 403), ("anonymous", 401), ("root", 202)]:
            with self.subTest(who=who):
                before = journal_state()
                response = self.terminate(self.running, {"then": "hold"}, who)
                assert response.status_code == status, response.content
                assert (journal_state() == before) == (status != 202)

    def test_it_is_in_the_openapi_schema(self) -> None:
        schema = Client().get("/api/openapi.json").json()
        operation = schema["paths"]["/api/runs/{code}/terminate"]["post"]
        assert {"200", "202", "409", "422"} <= set(operation["responses"])
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        terminate_in = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
        assert terminate_in["properties"]["then"]["enum"] == ["unwind", "hold"]
        assert terminate_in["required"] == ["then"]
