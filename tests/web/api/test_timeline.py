"""GET /api/runs/{code}/timeline: the run page's timeline as data, for whoever may read the
run, in a few queries of the run's rows."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.test import Client

from stateguard_web.sagas.models import Compensation, Step
from tests.web.api.world import World


class TimelineTests(World):
    def test_it_answers_the_bars_lanes_and_totals_of_a_run(self) -> None:
        started = self.stuck.created_at + timedelta(seconds=1)
        Step.objects.filter(run=self.stuck).update(
            started_at=started, finished_at=started + timedelta(seconds=2))
        Step.objects.create(run=self.stuck, step_id="t-mail", node="send_receipt",
                            status=Step.Status.SUCCEEDED, started_at=started,
                            finished_at=started + timedelta(seconds=1))  # beside the charge
        undone = started + timedelta(seconds=3)
        Compensation.objects.filter(pk=self.compensation.pk).update(created_at=undone)
        self.compensation.attempts.update(started_at=undone,
                                          finished_at=undone + timedelta(seconds=0.5))

        response = self.call("vera", "GET", f"/api/runs/{self.stuck.code}/timeline")
        assert response.status_code == 200
        line = response.json()
        assert (line["code"], line["status"], line["ticking"]) == (
            str(self.stuck.code), "needs_attention", False)
        assert (line["queued_ms"], line["lanes"]) == (1000.0, {"steps": 2, "compensations": 1})
        assert line["totals_ms"] == {"steps": 2000.0, "compensations": 500.0}
        assert [(b["group"], b["lane"], b["name"], b["status"], b["duration_ms"])
                for b in line["bars"]] == [
            ("steps", 0, "charge_user", "succeeded", 2000.0),
            ("steps", 1, "send_receipt", "succeeded", 1000.0),
            ("compensations", 0, "charge_user", "failed", 500.0)]
        (attempt,) = line["bars"][2]["attempts"]
        assert (attempt["ok"], attempt["summary"]) == (False,
                                                       "APIConnectionError: refund API down")

    def test_it_reads_the_run_and_its_rows_in_a_few_queries(self) -> None:
        self.call("vera", "GET", f"/api/runs/{self.stuck.code}/timeline")  # the key, cached
        # The run, then its steps, approvals, compensations and their attempts: each an index
        # range of the run's rows (the run page draws it from what it reads anyway).
        with self.assertNumQueries(5):
            response = self.call("vera", "GET", f"/api/runs/{self.stuck.code}/timeline")
        assert response.status_code == 200

    def test_it_is_refused_as_the_runs_detail_is(self) -> None:
        path = f"/api/runs/{self.stuck.code}/timeline"
        assert self.call("anonymous", "GET", path).status_code == 401
        assert self.call("bob", "GET", path).status_code == 404  # not his: not even there
        assert self.call("alice", "GET", path).status_code == 200  # her own run
        assert self.call("vera", "GET", f"/api/runs/{uuid.uuid4()}/timeline").status_code == 404
        refused = self.call("vera", "GET", "/api/runs/not-a-run/timeline")
        assert refused.status_code == 422 and refused.json()["code"] == "invalid"

    def test_it_is_in_the_openapi_schema(self) -> None:
        schema = Client().get("/api/openapi.json").json()
        operation = schema["paths"]["/api/runs/{code}/timeline"]["get"]
        assert operation["operationId"] == "get_run_timeline"
        assert {"200", "401", "404", "422"} <= set(operation["responses"])
        bar = schema["components"]["schemas"]["TimelineBarOut"]["properties"]
        assert bar["group"]["enum"] == ["model", "steps", "tools", "approvals", "compensations"]
