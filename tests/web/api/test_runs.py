"""The runs API in use: what a run's detail holds, the list's filters, sessions and CSRF,
idempotency keys, the actions' answers, the agents, and the OpenAPI schema."""

from __future__ import annotations

import uuid
from datetime import timedelta
from unittest import mock

from django.db.models.signals import post_save
from django.test import Client
from django.utils import timezone

from stateguard import InvariantViolation
from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Effect, Run, Step
from tests.web.api.world import CSRF_SECRET, PROVISION, World, journal_state


class DetailTests(World):
    def test_it_shows_steps_compensations_approvals_the_invariant_and_the_audit(self) -> None:
        now = timezone.now()
        violation = InvariantViolation("charged_within_amount", "charged 300 of 200",
                                       node="charge_user")
        error = {"type": "InvariantViolation", "message": str(violation), "traceback": "tb"}
        Step.objects.create(run=self.stuck, step_id="t-violated", node="charge_user",
                            status=Step.Status.VIOLATED, started_at=now, finished_at=now,
                            error=error, update={"amount_charged": 300})
        Run.objects.filter(pk=self.stuck.pk).update(error=error)
        decided = Approval.objects.create(run=self.stuck, step_id="t-gate", node="charge_user",
                                          payload={"amount": 300}, status="approved",
                                          decided_by="charlie", decided_at=now,
                                          requested_at=now)
        AuditEvent.objects.create(run=self.stuck, actor="charlie", action="run.approved",
                                  data={"via": "key sg_1a2b3c4d"})

        response = self.call("vera", "GET", f"/api/runs/{self.stuck.code}")
        assert response.status_code == 200
        run = response.json()
        assert (run["code"], run["status"], run["submitted_by"]) == (
            str(self.stuck.code), "needs_attention", "alice")
        assert run["error"]["type"] == "InvariantViolation"
        assert [(s["node"], s["status"]) for s in run["steps"]] == [
            ("charge_user", "succeeded"), ("charge_user", "violated")]
        assert run["steps"][0]["update"] == {"charge": "ch_1"}
        (comp,) = run["compensations"]
        assert (comp["id"], comp["status"], comp["idempotency_key"], comp["step_id"]) == (
            self.compensation.pk, "failed", "k-1", "t-charge-2")
        assert comp["retry_at"] is None  # it waits for nothing: a person's
        assert comp["attempts"][0]["error"]["message"] == "refund API down"
        (approval,) = run["approvals"]
        assert approval["id"] == decided.pk and approval["payload"] == {"amount": 300}
        assert (approval["status"], approval["decided_by"]) == ("approved", "charlie")
        assert approval["decided_at"] is not None
        assert run["violated_invariant"] == {"name": "charged_within_amount",
                                             "node": "charge_user",
                                             "message": "charged 300 of 200"}
        assert [(e["actor"], e["action"], e["data"]) for e in run["audit"]] == [
            ("charlie", "run.approved", {"via": "key sg_1a2b3c4d"})]

    def test_it_names_an_invariant_that_failed_on_the_final_state(self) -> None:
        violation = InvariantViolation("port_in_range", "port 99", phase="at the end")
        Run.objects.filter(pk=self.failed.pk).update(
            error={"type": "InvariantViolation", "message": str(violation), "traceback": ""})
        run = self.call("vera", "GET", f"/api/runs/{self.failed.code}").json()
        assert run["violated_invariant"] == {"name": "port_in_range", "node": None,
                                             "message": "port 99"}
        assert self.call("vera", "GET", f"/api/runs/{self.paused.code}").json()[
            "violated_invariant"] is None


class WaitingTests(World):
    """A refund that waits out an outage (RetryLater): its run compensating, its next round's
    time in the detail, and an operator's "try it now"."""

    def setUp(self) -> None:
        self.retry_at = (timezone.now() + timedelta(minutes=10)).replace(microsecond=0)
        Run.objects.filter(pk=self.stuck.pk).update(status=Run.Status.COMPENSATING)
        Compensation.objects.filter(pk=self.compensation.pk).update(
            status=Compensation.Status.WAITING, retry_at=self.retry_at)

    def test_it_gives_a_waiting_compensations_next_round_in_iso_8601(self) -> None:
        run = self.call("vera", "GET", f"/api/runs/{self.stuck.code}").json()

        assert run["status"] == "compensating"
        (comp,) = run["compensations"]
        assert comp["status"] == "waiting"
        assert comp["retry_at"] == self.retry_at.strftime("%Y-%m-%dT%H:%M:%SZ")

    def test_it_retries_a_waiting_compensation_now(self) -> None:
        response = self.call("charlie", "POST",
                             f"/api/compensations/{self.compensation.pk}/retry")

        assert response.status_code == 202
        assert (response.json()["status"], response.json()["request"]["action"]) == (
            "compensating", "retry_compensation")


class ListTests(World):
    def test_it_filters_and_pages_newest_first(self) -> None:
        old = Run.objects.create(agent="provision", input={"name": "legacy-db"},
                                 submitted_by=self.bob)
        Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))

        def codes(query: str) -> list[str]:
            response = self.call("charlie", "GET", f"/api/runs?{query}")
            assert response.status_code == 200, response.content
            return [item["code"] for item in response.json()["items"]]

        newest_first = [str(r.code) for r in (self.stuck, self.failed, self.paused, old)]
        assert codes("") == newest_first
        assert codes("limit=2") == newest_first[:2]
        assert codes("limit=2&offset=3") == newest_first[3:]
        assert self.call("charlie", "GET", "/api/runs?limit=1").json()["count"] == 4
        assert codes("status=failed") == [str(self.failed.code)]
        assert codes("agent=checkout") == [str(self.stuck.code), str(self.paused.code)]
        assert codes("q=LEGACY") == [str(old.code)]  # text in the input, any case
        assert codes("q=c%40d.co") == [str(self.stuck.code)]
        assert codes(f"q={self.paused.code}") == [str(self.paused.code)]
        assert codes(f"q={str(self.paused.code)[:8]}") == [str(self.paused.code)]
        since = (timezone.now() - timedelta(days=1)).isoformat()
        assert codes(f"created_before={since.replace('+', '%2B')}") == [str(old.code)]
        assert old.code not in codes(f"created_after={since.replace('+', '%2B')}")
        assert codes("status=paused&agent=provision") == []


class SessionTests(World):
    def test_it_needs_the_csrf_token_for_a_session_on_unsafe_methods(self) -> None:
        client = Client(enforce_csrf_checks=True)
        client.force_login(self.charlie)
        assert client.get("/api/runs").status_code == 200  # safe: no token needed
        before = journal_state()
        response = client.post(f"/api/runs/{self.failed.code}/retry")
        assert (response.status_code, response.json()["code"]) == (403, "csrf_failed")
        assert journal_state() == before
        client.cookies["csrftoken"] = CSRF_SECRET
        response = client.post(f"/api/runs/{self.failed.code}/retry",
                               HTTP_X_CSRFTOKEN=CSRF_SECRET)
        assert response.status_code == 202
        assert AuditEvent.objects.get(action="run.retry_requested").data == {}  # no key

    def test_it_judges_a_request_with_a_key_by_the_key_alone(self) -> None:
        client = Client(enforce_csrf_checks=True)
        client.force_login(self.charlie)
        response = client.get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {self.keys['expired']}")
        assert response.status_code == 401  # not the session's 200
        response = client.post(f"/api/runs/{self.failed.code}/retry",
                               HTTP_AUTHORIZATION=f"Bearer {self.keys['charlie']}")
        assert response.status_code == 202  # a key needs no CSRF token


class SubmitTests(World):
    def test_it_replays_a_submission_by_header_or_field(self) -> None:
        first = self.call("alice", "POST", "/api/runs", PROVISION, HTTP_IDEMPOTENCY_KEY="o-1")
        again = self.call("alice", "POST", "/api/runs", {**PROVISION, "idempotency_key": "o-1"})
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["code"] == again.json()["code"]
        # Another user's key is another key.
        bobs = self.call("bob", "POST", "/api/runs", PROVISION, HTTP_IDEMPOTENCY_KEY="o-1")
        assert bobs.status_code == 201 and bobs.json()["code"] != first.json()["code"]
        before = journal_state()
        response = self.call("alice", "POST", "/api/runs", {"agent": "provision",
                                                            "input": {"name": "other"}},
                             HTTP_IDEMPOTENCY_KEY="o-1")
        assert (response.status_code, response.json()["code"]) == (422, "idempotency_conflict")
        assert journal_state() == before


class ActionTests(World):
    def test_it_names_the_key_in_the_audit_trail(self) -> None:
        response = self.call("charlie", "POST", f"/api/runs/{self.failed.code}/retry")
        assert response.status_code == 202
        event = AuditEvent.objects.get(action="run.retry_requested")
        prefix = self.keys["charlie"][:11]
        assert (event.actor, event.data) == ("charlie", {"via": f"key {prefix}"})

    def test_it_accepts_a_decision_and_shows_the_request_waiting_for_a_worker(self) -> None:
        response = self.call("charlie", "POST", f"/api/runs/{self.paused.code}/reject",
                             {"approval": self.approval.pk, "reason": "looks like fraud"})
        assert response.status_code == 202
        request = response.json()["request"]
        assert (request["action"], request["by"]) == ("reject", "charlie")
        self.approval.refresh_from_db()
        assert (self.approval.status, self.approval.reason) == ("rejected", "looks like fraud")
        # Decided: the same approval again is a 409, with the reason.
        response = self.call("root", "POST", f"/api/runs/{self.paused.code}/approve",
                             {"approval": self.approval.pk})
        assert response.status_code == 409
        assert "no longer pending" in response.json()["detail"]

    def test_it_records_a_reason_given_with_an_approval(self) -> None:
        response = self.call("charlie", "POST", f"/api/runs/{self.paused.code}/approve",
                             {"approval": self.approval.pk, "reason": "known customer"})
        assert response.status_code == 202
        event = AuditEvent.objects.get(action="run.approved")
        assert event.data["reason"] == "known customer"

    def test_it_says_why_the_state_machine_refuses(self) -> None:
        response = self.call("charlie", "POST", f"/api/runs/{self.paused.code}/retry")
        assert (response.status_code, response.json()["code"]) == (409, "not_allowed_now")
        assert "only a failed run, or one held past its pivot, is retried" in response.json()[
            "detail"]
        response = self.call("charlie", "POST", f"/api/runs/{self.failed.code}/compensate")
        assert response.status_code == 202  # no body: no reason
        response = self.call("charlie", "POST", f"/api/runs/{self.failed.code}/retry")
        assert response.status_code == 409 and "waiting for a worker" in response.json()[
            "detail"]

    def test_it_retries_one_compensation_and_resolves_by_hand(self) -> None:
        response = self.call("charlie", "POST",
                             f"/api/compensations/{self.compensation.pk}/retry")
        assert response.status_code == 202
        assert response.json()["request"]["action"] == "retry_compensation"
        Run.objects.filter(pk=self.stuck.pk).update(request=None)  # a worker carried it out
        response = self.call("charlie", "POST", f"/api/runs/{self.stuck.code}/resolve",
                             {"note": "refunded in the Stripe dashboard"})
        assert response.status_code == 200 and response.json()["status"] == "compensated"
        response = self.call("charlie", "POST",
                             f"/api/compensations/{self.compensation.pk}/retry")
        assert response.status_code == 409
        assert self.call("charlie", "POST", "/api/compensations/999999/retry").status_code == 404


class AgentsAndSchemaTests(World):
    def test_it_describes_each_agent(self) -> None:
        agents = {a["name"]: a for a in self.call("alice", "GET", "/api/agents").json()}
        assert "noop5" not in agents  # benchmarks are not offered
        checkout = agents["checkout"]
        assert checkout["nodes"] == ["create_customer", "charge_user", "book_order"]
        assert checkout["compensated"] == ["charge_user"]  # by its "payment" tag
        assert checkout["approvals"] == ["charge_user"]
        assert set(checkout["input_schema"]["required"]) == {"email", "amount"}
        assert agents["provision"]["compensated"] == agents["provision"]["nodes"]
        assert checkout["tools"] == []
        travel = agents["travel"]  # an AI agent: its compensations are keyed by its tools
        assert travel["nodes"] == ["agent", "tools"]
        assert travel["tools"] == ["charge_card", "reserve_hotel", "send_confirmation"]
        assert travel["compensated"] == travel["tools"]

    def test_it_publishes_its_openapi_schema_and_docs(self) -> None:
        response = Client().get("/api/openapi.json")  # public, like the docs
        assert response.status_code == 200
        schema = response.json()
        assert set(schema["paths"]) == {
            "/api/runs", "/api/runs/{code}", "/api/runs/{code}/timeline",
            "/api/runs/{code}/events", "/api/runs/{code}/approve",
            "/api/runs/{code}/reject", "/api/runs/{code}/retry", "/api/runs/{code}/compensate",
            "/api/runs/{code}/resolve", "/api/runs/{code}/terminate",
            "/api/compensations/{id}/retry", "/api/agents", "/api/agents/{name}/map",
            "/api/agents/{name}/versions",
            "/api/batches", "/api/batches/{code}", "/api/batches/{code}/cancel",
            "/api/incidents", "/api/workers", "/api/queue", "/api/queue/throughput",
            "/api/runs/{code}/webhooks", "/api/webhooks/secret", "/api/webhooks/default"}
        statuses = schema["components"]["schemas"]["RunStatus"]["enum"]
        assert statuses == ["pending", "running", "paused", "failed", "succeeded",
                            "compensating", "compensated", "needs_attention"]
        assert schema["components"]["schemas"]["StepStatus"]["enum"] == [
            "started", "paused", "succeeded", "failed", "violated", "rewound"]
        for path, operations in schema["paths"].items():
            for method, operation in operations.items():
                with self.subTest(path=path, method=method):
                    assert {"401", "403", "500"} <= set(operation["responses"])
                    assert operation["security"] == [{"KeyAuth": []}, {"SessionAuth": []}]
        docs = Client().get("/api/docs")
        assert docs.status_code == 200 and b"swagger" in docs.content.lower()

    def test_it_answers_an_unexpected_error_with_a_json_500(self) -> None:
        with mock.patch("stateguard_web.runs.selectors.agent_list",
                        side_effect=RuntimeError("boom")), \
                self.assertLogs("stateguard_web.api", "ERROR"):
            response = self.call("alice", "GET", "/api/agents")
        assert response.status_code == 500
        assert response.json()["code"] == "internal_error" and "boom" not in str(
            response.content)

    def test_it_finds_no_run_under_an_unknown_code(self) -> None:
        response = self.call("charlie", "GET", f"/api/runs/{uuid.uuid4()}")
        assert (response.status_code, response.json()["code"]) == (404, "not_found")


class QueryTests(World):
    """What an API request with a key asks the database: a regression here costs every client
    (P6, docs/benchmarks.md). The key's last use is written once a minute, and a key is read
    from the database once per process and change (accounts/keycache.py), so each test first
    makes one request per key to get both out of the way: a known key asks nothing."""

    def test_a_read_is_one_query_the_run_with_its_history(self) -> None:
        Effect.objects.create(run=self.stuck, step_id="t-charge-2", node="charge_user",
                              provider="stripe", kind="charge", external_id="pi_1",
                              amount=500, currency="usd", recorded_at=timezone.now())
        AuditEvent.objects.create(run=self.stuck, actor="charlie", action="run.approved")
        path = f"/api/runs/{self.stuck.code}"
        for who in ("vera", "alice", "bob"):
            self.call(who, "GET", path)
        with self.assertNumQueries(1):
            response = self.call("vera", "GET", path)
        assert response.status_code == 200
        assert len(response.json()["compensations"][0]["attempts"]) == 1
        with self.assertNumQueries(1):  # a submitter's own run: the same
            assert self.call("alice", "GET", path).status_code == 200
        with self.assertNumQueries(1):  # someone else's: found, then refused as not there
            assert self.call("bob", "GET", path).status_code == 404

    def test_a_submission_is_the_run_and_its_audit_event_saved_together(
            self) -> None:
        self.call("alice", "GET", "/api/agents")
        saved: list[tuple[str, bool]] = []

        def on_save(sender: type, created: bool, **_: object) -> None:
            saved.append((sender.__name__, created))

        post_save.connect(on_save, weak=False, dispatch_uid="test-submission")
        self.addCleanup(post_save.disconnect, dispatch_uid="test-submission")
        with self.assertNumQueries(4) as queries:  # SAVEPOINT, 2 INSERTs, RELEASE
            response = self.call("alice", "POST", "/api/runs", PROVISION)
        assert response.status_code == 201
        assert [q["sql"].split()[0] for q in queries.captured_queries] == [
            "SAVEPOINT", "INSERT", "INSERT", "RELEASE"]
        # Both through their models' save(): signals (and AuditEvent.save()'s rules) apply.
        assert saved == [("Run", True), ("AuditEvent", True)]
        run = Run.objects.get(code=response.json()["code"])
        event = AuditEvent.objects.get(run=run)
        assert (event.run_code, event.action, event.actor, event.data) == (
            run.code, "run.submitted", "alice", {"agent": "provision", "via": event.data["via"]})
        assert event.data["via"].startswith("key sg_")
        assert run.created_at is not None and run.status == Run.Status.PENDING

    def test_the_detail_read_in_one_query_is_the_detail_read_relation_by_relation(
            self) -> None:
        now = timezone.now()
        Effect.objects.create(run=self.stuck, step_id="t-charge-2", node="charge_user",
                              provider="stripe", kind="refund", external_id="re_1",
                              amount=500, currency="usd", undoes="pi_1",
                              recorded_at=now.replace(microsecond=0))  # PostgreSQL: no .0
        self.compensation.attempts.create(number=2, started_at=now, finished_at=now, ok=True,
                                          result="undone")
        Approval.objects.create(run=self.stuck, step_id="t-gate", node="charge_user",
                                requested_at=now, payload={"amount": 1})
        AuditEvent.objects.create(run=self.stuck, actor="charlie", action="run.approved",
                                  data={"via": "key sg_1a2b3c4d"})
        with self.assertNumQueries(1):
            joined = selectors.run_detail(run=selectors.run_get(code=self.stuck.code,
                                                                detail=True))
        with self.assertNumQueries(7):  # the run, then its relations one by one
            apart = selectors.run_detail(run=selectors.run_get(code=self.stuck.code))
        assert joined == apart
        assert [a["number"] for a in joined["compensations"][0]["attempts"]] == [1, 2]
        assert joined["effects"][0]["undoes"] == "pi_1"
        assert joined["approvals"][0]["decided_by"] is None
