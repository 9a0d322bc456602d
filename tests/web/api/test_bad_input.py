"""Bad input gets a clear 4xx that says what is wrong, stores nothing, and is never a 500."""

from __future__ import annotations

import json
from typing import Any

from django.test import override_settings

from stateguard_web.runs import runtime
from tests.web.api.world import World, journal_state
from tests.web.conftest import AGENT_INPUTS

OK = {"agent": "provision", "input": {"name": "web-1"}}


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


class BadInputTests(World):
    def check(self, who: str, method: str, path: str, body: Any, status: int, code: str,
              loc: list[Any] | None = None, **headers: str) -> None:
        before = journal_state()
        response = self.call(who, method, path, body, **headers)
        assert response.status_code == status, response.content
        data = response.json()
        assert data["code"] == code and data["detail"], data
        if loc is not None:
            assert loc in [e["loc"] for e in data["errors"]], data
        assert journal_state() == before  # nothing stored

    def test_it_refuses_bodies_that_are_not_json(self) -> None:
        for body in ["{not json", "", "\"unterminated", '{"agent": "provision", "input": NaN}',
                     '{"agent": "provision", "input": {"size": Infinity}}', "[" * 100_000,
                     json.dumps({"agent": "provision", "input": nested(40)})]:
            with self.subTest(body=body[:40]):
                status, code = (422, "invalid") if body == "" else (400, "malformed_json")
                self.check("alice", "POST", "/api/runs", body, status, code)
        response = self.client.post("/api/runs", b"\xff\xfe{}", content_type="application/json",
                                    HTTP_AUTHORIZATION=f"Bearer {self.keys['alice']}")
        assert (response.status_code, response.json()["code"]) == (400, "malformed_json")

    def test_a_retry_with_a_body_that_is_not_json_is_a_400(self) -> None:
        # The retry reads its optional body itself (found by the schema fuzz: it was a 500).
        for body in ["\x00", "{not json", "[" * 100_000]:
            with self.subTest(body=body[:10]):
                self.check("charlie", "POST", f"/api/runs/{self.failed.code}/retry", body, 400,
                           "malformed_json")
        assert self.failed.__class__.objects.get(pk=self.failed.pk).status == "failed"

    def test_it_refuses_a_body_over_the_limit_with_413(self) -> None:
        big = json.dumps({"agent": "provision", "input": {"name": "x" * 1_100_000}})
        self.check("alice", "POST", "/api/runs", big, 413, "body_too_large")
        self.check("anonymous", "POST", "/api/runs", big, 413, "body_too_large")  # before auth
        with override_settings(STATEGUARD_API_MAX_BODY_BYTES=100):
            self.check("alice", "POST", "/api/runs", {**OK, "input": {"name": "x" * 100}}, 413,
                       "body_too_large")
            assert self.call("alice", "POST", "/api/runs", OK).status_code == 201
        # Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE) is a 413 too, not a 400 or a 500.
        with override_settings(STATEGUARD_API_MAX_BODY_BYTES=10_000_000,
                               DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
            self.check("alice", "POST", "/api/runs", {**OK, "input": {"name": "x" * 2000}}, 413,
                       "body_too_large")

    def test_it_names_the_field_that_is_wrong(self) -> None:
        cases: list[tuple[Any, list[Any]]] = [
            ({"agent": 5, "input": {}}, ["body", "agent"]),
            ({"agent": "nope", "input": {}}, ["body", "agent"]),
            ({"agent": "a" * 101, "input": {}}, ["body", "agent"]),
            ({"agent": "pro\x00vision", "input": {}}, ["body", "agent"]),
            ({"agent": "provision", "input": "web-1"}, ["body", "input"]),
            ({"agent": "provision", "input": {"name": "a\x00"}}, ["body", "input"]),
            ({"agent": "provision", "input": {"\x00": "a"}}, ["body", "input"]),
            ({"agent": "provision", "input": {"name": 5}}, ["body", "input", "name"]),
            ({"agent": "provision", "input": {"name": "x" * 41}}, ["body", "input", "name"]),
            ({"agent": "provision", "input": {"name": "a", "surprise": 1}},
             ["body", "input", "surprise"]),
            ({**OK, "surprise": 1}, ["body", "surprise"]),
            ({**OK, "idempotency_key": "k" * 201}, ["body", "idempotency_key"]),
            ({**OK, "idempotency_key": "bad\nkey"}, ["body", "idempotency_key"]),
            ({**OK, "idempotency_key": 7}, ["body", "idempotency_key"]),
            ([OK], ["body"]),
            ({}, ["body", "agent"]),
        ]
        for body, loc in cases:
            with self.subTest(body=str(body)[:60]):
                self.check("alice", "POST", "/api/runs", body, 422, "invalid", loc)
        self.check("alice", "POST", "/api/runs", OK, 422, "invalid",
                   ["header", "Idempotency-Key"], HTTP_IDEMPOTENCY_KEY="k" * 201)
        self.check("alice", "POST", "/api/runs", {**OK, "idempotency_key": "o-2"}, 422,
                   "invalid", ["header", "Idempotency-Key"], HTTP_IDEMPOTENCY_KEY="o-3")

    @override_settings(STATEGUARD_BENCH_AGENTS=True)
    def test_it_refuses_an_input_field_of_the_wrong_type_for_every_agent(self) -> None:
        # No coercion: "4200" is not an amount, 1 not a true, 2.0 not a number of nights.
        self.check("alice", "POST", "/api/runs",
                   {"agent": "checkout", "input": {"email": "a@b.co", "amount": "4200"}},
                   422, "invalid", ["body", "input", "amount"])
        wrong = {"integer": ["4200", 2.0, True], "number": ["0.5", False], "boolean": [1, "true"]}
        checked = set()
        for agent, good in AGENT_INPUTS.items():
            schema = runtime.agent_spec(agent).input_schema.model_json_schema()
            for field, spec in schema["properties"].items():
                kinds = {spec.get("type")} | {s.get("type") for s in spec.get("anyOf", [])}
                for value in [v for kind in kinds & set(wrong) for v in wrong[kind]]:
                    with self.subTest(agent=agent, field=field, value=value):
                        self.check("alice", "POST", "/api/runs",
                                   {"agent": agent, "input": {**good, field: value}},
                                   422, "invalid", ["body", "input", field])
                        checked.add((agent, field))
        assert {("checkout", "amount"), ("checkout", "fail_booking"), ("travel", "nights"),
                ("provision", "sleep_seconds"), ("noop5", "n")} <= checked

    def test_it_refuses_bad_ids_and_queries(self) -> None:
        paused = f"/api/runs/{self.paused.code}"
        cases: list[tuple[str, str, Any, list[Any]]] = [
            ("GET", "/api/runs/123", None, ["path", "code"]),
            ("GET", "/api/runs/not-a-uuid", None, ["path", "code"]),
            ("POST", "/api/runs/x%00/retry", None, ["path", "code"]),
            ("POST", "/api/compensations/abc/retry", None, ["path", "id"]),
            ("POST", "/api/compensations/0/retry", None, ["path", "id"]),
            ("POST", f"/api/compensations/{10**30}/retry", None, ["path", "id"]),
            ("GET", "/api/runs?limit=100000", None, ["query", "limit"]),
            ("GET", "/api/runs?limit=0", None, ["query", "limit"]),
            ("GET", "/api/runs?offset=-1", None, ["query", "offset"]),
            ("GET", f"/api/runs?offset={10**30}", None, ["query", "offset"]),
            ("GET", "/api/runs?limit=ten", None, ["query", "limit"]),
            ("GET", "/api/runs?status=lost", None, ["query", "status", 0]),
            ("GET", "/api/runs?created_after=yesterday", None, ["query", "created_after"]),
            # Not seconds since 1970 (pydantic's reading): "2024" was 1970-01-01T00:33:44Z.
            ("GET", "/api/runs?created_after=2024", None, ["query", "created_after"]),
            ("GET", "/api/runs?created_before=0.5", None, ["query", "created_before"]),
            ("GET", "/api/runs?created_before=0001-01-01T00:00:00%2B05:00", None,
             ["query", "created_before"]),
            ("GET", "/api/runs?q=%00", None, ["query", "q"]),
            ("GET", "/api/runs?agent=a%00", None, ["query", "agent"]),
            ("GET", "/api/runs?q=" + "x" * 201, None, ["query", "q"]),
            ("POST", f"{paused}/approve", {}, ["body", "approval"]),
            ("POST", f"{paused}/approve", {"approval": "first"}, ["body", "approval"]),
            ("POST", f"{paused}/approve", {"approval": 10**30}, ["body", "approval"]),
            ("POST", f"{paused}/approve", {"approval": 1, "by": "root"}, ["body", "by"]),
            ("POST", f"{paused}/reject", {"approval": 1, "reason": "r" * 2001},
             ["body", "reason"]),
            ("POST", f"{paused}/reject", {"approval": 1, "reason": "\x00"}, ["body", "reason"]),
            ("POST", f"{paused}/compensate", {"reason": ["no"]}, ["body", "reason"]),
            ("POST", f"/api/runs/{self.stuck.code}/resolve", {}, ["body", "note"]),
            ("POST", f"/api/runs/{self.stuck.code}/resolve", {"note": "   "}, ["body", "note"]),
        ]
        for method, path, body, loc in cases:
            with self.subTest(method=method, path=path[:60], body=str(body)[:40]):
                self.check("charlie", method, path, body, 422, "invalid", loc)

    def test_it_refuses_an_approval_of_another_run_or_one_decided_already(self) -> None:
        other = self.stuck.approvals.create(step_id="t9", node="charge_user",
                                            requested_at=self.stuck.created_at)
        self.check("charlie", "POST", f"/api/runs/{self.paused.code}/approve",
                   {"approval": other.pk}, 404, "not_found")
        self.check("charlie", "POST", f"/api/runs/{self.paused.code}/approve",
                   {"approval": 10**12}, 404, "not_found")
        self.approval.status, self.approval.decided_by = "rejected", "dora"
        self.approval.save()
        self.check("charlie", "POST", f"/api/runs/{self.paused.code}/approve",
                   {"approval": self.approval.pk}, 409, "not_allowed_now")

    def test_it_refuses_a_malformed_authorization_header(self) -> None:
        for header in ["Basic YWxpY2U6eA==", "Bearer", "Bearer ", "Token abc",
                       f"Bearer {self.keys['alice']}\x00"]:
            with self.subTest(header=header):
                self.check("anonymous", "POST", "/api/runs", OK, 401, "not_authenticated",
                           HTTP_AUTHORIZATION=header)
