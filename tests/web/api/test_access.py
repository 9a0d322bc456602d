"""Every endpoint by every principal: the status, and that a refused call changed nothing."""

from __future__ import annotations

from django.db import transaction

from tests.web.api.world import PROVISION, World, journal_state

PRINCIPALS = ["anonymous", "vera", "alice", "bob", "charlie", "root", "revoked", "expired"]

# Expected statuses, in the order of PRINCIPALS: anonymous, viewer, submitter (alice, whose
# runs these are), another submitter (bob), operator, superuser session, revoked key, expired.
TABLE = [
    ("submit", "POST", "/api/runs", PROVISION,
     [401, 403, 201, 201, 403, 201, 401, 401]),
    ("list", "GET", "/api/runs", None,
     [401, 200, 200, 200, 200, 200, 401, 401]),
    ("detail", "GET", "/api/runs/{paused}", None,
     [401, 200, 200, 404, 200, 200, 401, 401]),
    ("events", "GET", "/api/runs/{paused}/events", None,
     [401, 200, 200, 404, 200, 200, 401, 401]),
    ("unknown run", "GET", "/api/runs/00000000-0000-4000-8000-000000000000", None,
     [401, 404, 404, 404, 404, 404, 401, 401]),
    ("approve", "POST", "/api/runs/{paused}/approve", {"approval": "{approval}"},
     [401, 403, 403, 403, 202, 202, 401, 401]),
    ("reject", "POST", "/api/runs/{paused}/reject", {"approval": "{approval}", "reason": "no"},
     [401, 403, 403, 403, 202, 202, 401, 401]),
    ("retry", "POST", "/api/runs/{failed}/retry", None,
     [401, 403, 403, 403, 202, 202, 401, 401]),
    ("compensate", "POST", "/api/runs/{failed}/compensate", {"reason": "customer asked"},
     [401, 403, 403, 403, 202, 202, 401, 401]),
    # Operators only; a failed run is stopped already (409: compensate it instead).
    ("terminate", "POST", "/api/runs/{failed}/terminate", {"then": "hold"},
     [401, 403, 403, 403, 409, 409, 401, 401]),
    ("resolve", "POST", "/api/runs/{stuck}/resolve", {"note": "refunded by hand"},
     [401, 403, 403, 403, 200, 200, 401, 401]),
    ("retry compensation", "POST", "/api/compensations/{compensation}/retry", None,
     [401, 403, 403, 403, 202, 202, 401, 401]),
    ("agents", "GET", "/api/agents", None,
     [401, 200, 200, 200, 200, 200, 401, 401]),
    # The workers and the queue tell of everyone's runs: not for a submitter.
    ("workers", "GET", "/api/workers", None,
     [401, 200, 403, 403, 200, 200, 401, 401]),
    ("queue", "GET", "/api/queue", None,
     [401, 200, 403, 403, 200, 200, 401, 401]),
    ("throughput", "GET", "/api/queue/throughput", None,
     [401, 200, 403, 403, 200, 200, 401, 401]),
]


class AccessTests(World):
    def fill(self, value: object) -> object:
        ids = {"paused": self.paused.code, "failed": self.failed.code, "stuck": self.stuck.code,
               "compensation": self.compensation.pk}
        if isinstance(value, str):
            if value == "{approval}":
                return self.approval.pk
            return value.format(**ids)
        if isinstance(value, dict):
            return {k: self.fill(v) for k, v in value.items()}
        return value

    def test_it_answers_every_endpoint_for_every_principal_as_the_roles_say(self) -> None:
        assert len(TABLE) >= 10 and all(len(row[-1]) == len(PRINCIPALS) for row in TABLE)
        for name, method, path, body, statuses in TABLE:
            for who, expected in zip(PRINCIPALS, statuses, strict=True):
                with self.subTest(endpoint=name, principal=who):
                    before = journal_state()
                    sid = transaction.savepoint()
                    try:
                        response = self.call(who, method, self.fill(path), self.fill(body))
                        after = journal_state()
                    finally:
                        transaction.savepoint_rollback(sid)
                    assert response.status_code == expected, response.content
                    streams = name == "events" and expected == 200  # Server-Sent Events
                    assert response["Content-Type"].startswith(
                        "text/event-stream" if streams else "application/json")
                    if expected >= 400:
                        assert set(response.json()) >= {"detail", "code"}
                        assert after == before  # a refusal changed nothing
                    elif method == "POST":
                        assert after != before  # (the table's successes do change it)

    def test_it_lists_only_its_own_runs_to_a_submitter(self) -> None:
        for who, count in [("alice", 3), ("bob", 0), ("vera", 3), ("charlie", 3), ("root", 3)]:
            with self.subTest(principal=who):
                assert self.call(who, "GET", "/api/runs").json()["count"] == count

    def test_it_says_why_a_key_is_refused(self) -> None:
        for who, detail in [("revoked", "API key revoked"), ("expired", "API key expired")]:
            with self.subTest(principal=who):
                response = self.call(who, "GET", "/api/runs")
                assert response.json() == {"detail": detail, "code": "not_authenticated"}
                assert response["WWW-Authenticate"].startswith("Bearer")
        wrong = self.keys["charlie"][:-4] + "AAAA"  # the right prefix, a wrong secret
        response = self.client.get("/api/runs", HTTP_AUTHORIZATION=f"Bearer {wrong}")
        assert response.json()["detail"] == "invalid API key"
