"""/api/batches: who may make, read and cancel a batch, what a bad selection gets, and the
answers' shapes. The batch's worker runs in this process (test_batches.py tests it further)."""

from __future__ import annotations

import uuid

from django.test import override_settings

from stateguard_web.batches import worker as batch_worker
from stateguard_web.sagas.models import AuditEvent, Batch, Run
from tests.web.api.world import World, journal_state

FAILED = {"action": "compensate", "filter": {"status": "failed"}}


class BatchApiTests(World):
    def test_it_makes_a_batch_from_a_filter_and_shows_its_progress(self) -> None:
        with self.captureOnCommitCallbacks(execute=False) as queued:
            response = self.call("charlie", "POST", "/api/batches",
                                 {**FAILED, "reason": "provider outage"})
        assert response.status_code == 202, response.content
        batch = response.json()
        assert (batch["action"], batch["status"], batch["created_by"]) == (
            "compensate", "running", "charlie")
        assert batch["selection"] == {"filter": {"status": "failed"}}
        assert batch["counts"] == {"pending": 1, "done": 0, "skipped": 0, "failed": 0,
                                   "total": 1}
        assert batch["items"] == [{"run": str(self.failed.code), "status_before": "failed",
                                   "outcome": "pending", "reason": "", "finished_at": None}]
        assert len(queued) == 1  # the worker's task
        assert AuditEvent.objects.get(action="batch.created").data["via"].startswith("key sg_")

        batch_worker.batch_process(batch_pk=Batch.objects.get().pk, owner="w1")
        done = self.call("vera", "GET", f"/api/batches/{batch['code']}").json()
        assert (done["status"], done["counts"]["done"], done["items"][0]["outcome"]) == (
            "done", 1, "done")
        assert done["finished_at"] is not None
        (event,) = AuditEvent.objects.filter(run=self.failed)
        assert event.action == "run.compensate_requested" and event.data["reason"] == (
            "provider outage")

    def test_it_takes_runs_by_code_in_their_order(self) -> None:
        codes = [str(self.stuck.code), str(self.paused.code)]
        response = self.call("root", "POST", "/api/batches",
                             {"action": "retry_compensations", "runs": codes})
        assert response.status_code == 202, response.content
        assert [i["run"] for i in response.json()["items"]] == codes
        assert response.json()["selection"] == {"runs": codes}

    def test_it_previews_a_batch_without_storing_it(self) -> None:
        state = journal_state()
        response = self.call("charlie", "POST", "/api/batches",
                             {"action": "compensate", "filter": {}, "dry_run": True})
        assert response.status_code == 200, response.content
        assert response.json() == {"action": "compensate", "count": 3, "eligible": 3,
                                   "statuses": {"needs_attention": 1, "failed": 1,
                                                "paused": 1},
                                   "runs": [str(r.code) for r in (self.stuck, self.failed,
                                                                  self.paused)]}
        assert journal_state() == state and not Batch.objects.exists()

    def test_it_cancels_a_batch_once(self) -> None:
        code = self.call("charlie", "POST", "/api/batches", FAILED).json()["code"]
        response = self.call("charlie", "POST", f"/api/batches/{code}/cancel")
        assert response.status_code == 200, response.content
        assert (response.json()["status"], response.json()["cancelled_by"]) == (
            "cancelled", "charlie")
        assert response.json()["items"][0]["reason"] == (
            "the batch was cancelled by charlie before this run")
        again = self.call("charlie", "POST", f"/api/batches/{code}/cancel")
        assert again.status_code == 409 and again.json()["code"] == "not_allowed_now"
        assert again.json()["detail"] == f"batch {code} is cancelled already"

    def test_it_lets_only_operators_make_or_cancel_batches(self) -> None:
        code = self.call("charlie", "POST", "/api/batches", FAILED).json()["code"]
        state = journal_state()
        for who, status in [("alice", 403), ("vera", 403), ("anonymous", 401),
                            ("revoked", 401), ("expired", 401)]:
            with self.subTest(who=who):
                made = self.call(who, "POST", "/api/batches", FAILED)
                assert made.status_code == status, made.content
                cancel = self.call(who, "POST", f"/api/batches/{code}/cancel")
                assert cancel.status_code == status, cancel.content
        assert journal_state() == state and Batch.objects.count() == 1
        assert Batch.objects.get().status == "running"

    def test_it_shows_batches_to_those_who_see_every_run_only(self) -> None:
        code = self.call("charlie", "POST", "/api/batches", FAILED).json()["code"]
        assert self.call("vera", "GET", f"/api/batches/{code}").status_code == 200
        assert self.call("alice", "GET", f"/api/batches/{code}").status_code == 404
        assert self.call("anonymous", "GET", f"/api/batches/{code}").status_code == 401
        missing = self.call("vera", "GET", f"/api/batches/{uuid.uuid4()}")
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"
        assert self.call("vera", "GET", "/api/batches/nope").status_code == 422

    def test_it_refuses_bad_input_with_a_named_422_and_stores_nothing(self) -> None:
        unknown = str(uuid.uuid4())
        cases = [
            ({"action": "delete", "filter": {}}, ["body", "action"]),
            ({"action": "retry"}, ["body"]),
            ({"action": "retry", "runs": [str(self.failed.code)], "filter": {}}, ["body"]),
            ({"action": "retry", "runs": []}, ["body", "runs"]),
            ({"action": "retry", "runs": ["not-a-uuid"]}, ["body", "runs", 0]),
            ({"action": "retry", "runs": [str(self.failed.code), unknown]},
             ["body", "runs", 1]),
            ({"action": "retry", "filter": {"status": "lost"}}, ["body", "filter", "status"]),
            ({"action": "retry", "filter": {"colour": "red"}}, ["body", "filter", "colour"]),
            ({"action": "retry", "filter": {"created_after": 2024}},
             ["body", "filter", "created_after"]),
            ({"action": "retry", "filter": {"status": "compensated"}}, ["body", "filter"]),
            ({"action": "retry", "filter": {}, "reason": "x" * 2001}, ["body", "reason"]),
        ]
        state = journal_state()
        for body, loc in cases:
            with self.subTest(body=body):
                response = self.call("charlie", "POST", "/api/batches", body)
                assert response.status_code == 422, response.content
                assert response.json()["code"] == "invalid"
                assert loc in [e["loc"] for e in response.json()["errors"]], response.json()
        with override_settings(STATEGUARD_BATCH_MAX_RUNS=2):
            response = self.call("charlie", "POST", "/api/batches",
                                 {"action": "compensate", "filter": {}})
        assert response.status_code == 422
        assert response.json()["detail"] == ("the filter matches 3 runs; a batch takes at "
                                             "most 2: narrow the filter")
        assert self.call("charlie", "POST", "/api/batches", "{nope").status_code == 400
        assert journal_state() == state and not Batch.objects.exists()

    def test_it_is_in_the_openapi_schema(self) -> None:
        paths = self.client.get("/api/openapi.json").json()["paths"]
        assert set(paths["/api/batches"]["post"]["responses"]) >= {"200", "202", "403", "422"}
        assert "get" in paths["/api/batches/{code}"]
        assert "409" in paths["/api/batches/{code}/cancel"]["post"]["responses"]
        assert Run.objects.count() == 3  # nothing made by reading it
