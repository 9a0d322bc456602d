"""/api/incidents: the groups the Incidents page shows, for whom, with what a bad query gets; and
a group's filter taking exactly its runs in GET /api/runs and POST /api/batches."""

from __future__ import annotations

from urllib.parse import urlencode

from stateguard_web.sagas.models import Batch, Run
from tests.web.api.world import World, journal_state
from tests.web.incident_world import incident


class IncidentApiTests(World):
    @classmethod
    def setUpTestData(cls) -> None:
        super().setUpTestData()  # a failed provision run, a checkout that needs attention
        cls.down = [incident("checkout", "charge_user", "APIConnectionError", by=cls.alice,
                             message=f"Stripe down {i}") for i in range(2)]
        cls.bobs = incident("checkout", "charge_user", "APIConnectionError", by=cls.bob)

    def test_it_lists_the_groups_a_viewer_sees(self) -> None:
        response = self.call("vera", "GET", "/api/incidents")
        assert response.status_code == 200, response.content
        page = response.json()
        assert (page["window"], page["bar_seconds"], page["more"]) == ("24h", 3600, False)
        top, *others = page["items"]
        assert {k: top[k] for k in ("agent", "step", "error_type", "status", "count")} == {
            "agent": "checkout", "step": "charge_user", "error_type": "APIConnectionError",
            "status": "failed", "count": 3}
        assert top["sample_run"] == str(self.bobs.code) and len(top["bars"]) == 24
        assert sum(top["bars"]) == 3 and top["first_seen"] <= top["last_seen"]
        assert top["filter"] == {"status": "failed", "agent": "checkout",
                                 "step": "charge_user", "error_type": "APIConnectionError"}
        # The world's runs made failed at once: no step or error type on record.
        assert sorted((g["agent"], g["status"], g["filter"]["step"]) for g in others) == [
            ("checkout", "needs_attention", "-"), ("provision", "failed", "-")]

    def test_it_shows_a_submitter_its_own_runs_only(self) -> None:
        items = self.call("bob", "GET", "/api/incidents").json()["items"]
        assert [(g["count"], g["sample_run"]) for g in items] == [(1, str(self.bobs.code))]

    def test_it_narrows_and_sorts(self) -> None:
        query = urlencode({"status": "needs_attention", "window": "7d", "sort": "recent"})
        page = self.call("charlie", "GET", f"/api/incidents?{query}").json()
        assert [g["status"] for g in page["items"]] == ["needs_attention"]
        assert len(page["items"][0]["bars"]) == 28 and page["bar_seconds"] == 6 * 3600
        limited = self.call("charlie", "GET", "/api/incidents?limit=1").json()
        assert len(limited["items"]) == 1 and limited["more"]
        agent = self.call("charlie", "GET", "/api/incidents?agent=provision").json()
        assert [g["agent"] for g in agent["items"]] == ["provision"]

    def test_it_refuses_a_bad_query_and_strangers(self) -> None:
        for query in ("window=1y", "status=succeeded", "limit=0", "limit=101", "sort=worst",
                      "agent=", "agent=%00x"):
            response = self.call("vera", "GET", f"/api/incidents?{query}")
            assert response.status_code == 422, (query, response.content)
        assert self.call("anonymous", "GET", "/api/incidents").status_code == 401
        assert self.call("revoked", "GET", "/api/incidents").status_code == 401

    def test_a_groups_filter_takes_its_runs_in_the_list_and_a_batch(self) -> None:
        (top, *_) = self.call("charlie", "GET", "/api/incidents").json()["items"]
        listed = self.call("charlie", "GET", f"/api/runs?{urlencode(top['filter'])}").json()
        assert listed["count"] == 3
        assert {r["code"] for r in listed["items"]} == {str(r.code) for r in
                                                        (*self.down, self.bobs)}
        none = self.call("charlie", "GET", "/api/runs?step=-&error_type=-").json()
        assert none["count"] == 2  # the world's two, made failed with nothing on record
        state = journal_state()
        preview = self.call("charlie", "POST", "/api/batches",
                            {"action": "retry", "filter": top["filter"], "dry_run": True})
        assert preview.status_code == 200, preview.content
        assert (preview.json()["count"], preview.json()["eligible"]) == (3, 3)
        assert journal_state() == state and not Batch.objects.exists()
        bad = self.call("charlie", "GET", "/api/runs?step=" + "x" * 201)
        assert bad.status_code == 422

    def test_it_is_in_the_openapi_schema(self) -> None:
        paths = self.client.get("/api/openapi.json").json()["paths"]
        operation = paths["/api/incidents"]["get"]
        assert operation["operationId"] == "list_incidents"
        assert set(operation["responses"]) >= {"200", "401", "403", "422"}
        names = {p["name"] for p in paths["/api/runs"]["get"]["parameters"]}
        assert {"step", "error_type"} <= names
        assert Run.objects.count() == 6  # nothing made by reading it
