"""An agent's map (runs/agent_map.py, dashboard/agent_map.py, GET /api/agents/{name}/map):
the counts of each node for each category, the window, who sees which runs, the tools of an AI
agent under its tools node, and the runs list a click opens holding exactly the runs counted.

The journal is made by hand: a travel run in each state a run can stand or stop at a node.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.test import Client, TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard_web.accounts import access
from stateguard_web.api.schemas import Stopped, Window
from stateguard_web.batches import services as batches
from stateguard_web.runs import agent_map, selectors
from stateguard_web.runs.filters import RANGES
from stateguard_web.sagas.models import Approval, Run, Step
from tests.web.api.world import make_user

S, R, A = Step.Status, Run.Status, Approval.Status
TOOLS = ["charge_card", "reserve_hotel", "send_confirmation"]


def run(agent: str, status: str, *steps: tuple[str, str], by: Any = None,
        age: timedelta = timedelta(minutes=5), approvals: tuple[tuple[str, str], ...] = ()
        ) -> Run:
    """A run created ``age`` ago with ``steps`` (node, status) and ``approvals`` (node,
    status)."""
    made = Run.objects.create(agent=agent, status=status, submitted_by=by)
    when = timezone.now() - age
    Run.objects.filter(pk=made.pk).update(created_at=when)
    for i, (node, step_status) in enumerate(steps):
        Step.objects.create(run=made, step_id=f"{made.code}-{i}", node=node, status=step_status,
                            started_at=when)
    for i, (node, approval_status) in enumerate(approvals):
        Approval.objects.create(run=made, step_id=f"{made.code}-a{i}", node=node,
                                status=approval_status, requested_at=when)
    made.refresh_from_db()
    return made


class MapWorld(TestCase):
    @classmethod
    def setUpTestData(cls) -> None:
        cls.alice = make_user("alice", "submitter")
        cls.bob = make_user("bob", "submitter")
        cls.vera = make_user("vera", "viewer", password="pw")
        ok = ("agent", S.SUCCEEDED)
        cls.runs = {
            # running: the tools node and the tool call it runs now
            "now": run("travel", R.RUNNING, ok, ("tools", S.STARTED), ("charge_card", S.STARTED),
                       by=cls.alice),
            # paused before a tool call: the tools node's body paused, the approval pending
            "waiting": run("travel", R.PAUSED, ok, ("tools", S.PAUSED),
                           approvals=(("charge_card", A.PENDING),)),
            "failed": run("travel", R.FAILED, ok, ("charge_card", S.SUCCEEDED),
                          ("reserve_hotel", S.FAILED), ("tools", S.FAILED)),
            "attention": run("travel", R.NEEDS_ATTENTION, ok, ("send_confirmation", S.VIOLATED),
                             ("tools", S.FAILED)),
            "compensated": run("travel", R.COMPENSATED, ok, ("charge_card", S.SUCCEEDED),
                               ("reserve_hotel", S.FAILED), ("tools", S.FAILED)),
            # an operator rejected the charge: no step of it, its approval rejected
            "rejected": run("travel", R.COMPENSATED, ok, ("tools", S.FAILED),
                            approvals=(("charge_card", A.REJECTED),)),
            # a worker died in the tools node, and recovery is undoing the run
            "in_doubt": run("travel", R.COMPENSATING, ok, ("tools", S.STARTED)),
            # a tool the registry does not list, named by the journal
            "unlisted": run("travel", R.FAILED, ok, ("lookup_weather", S.FAILED),
                            ("tools", S.FAILED)),
            "succeeded": run("travel", R.SUCCEEDED, ok, ("tools", S.SUCCEEDED),
                             ("charge_card", S.SUCCEEDED)),
            "pending": run("travel", R.PENDING),
            "hours_ago": run("travel", R.FAILED, ok, ("reserve_hotel", S.FAILED),
                             age=timedelta(hours=3)),
            "days_ago": run("travel", R.FAILED, ok, ("reserve_hotel", S.FAILED),
                            age=timedelta(days=3)),
            "weeks_ago": run("travel", R.FAILED, ok, ("reserve_hotel", S.FAILED),
                             age=timedelta(days=8)),
            "bobs": run("travel", R.FAILED, ok, ("send_confirmation", S.FAILED), by=cls.bob),
            "checkout": run("checkout", R.FAILED, ("charge_user", S.FAILED)),
        }

    def counts(self, window: str = "1h", runs: Any = None) -> agent_map.AgentMap:
        return agent_map.agent_map(runs=Run.objects.all() if runs is None else runs,
                                   agent="travel", window=window, now=timezone.now())

    def table(self, found: agent_map.AgentMap) -> dict[str, tuple[int, int, int, int]]:
        return {node: (c.now, c.waiting, c.failed, c.compensated)
                for node, c in found.nodes.items()}


class CountsTests(MapWorld):
    def test_it_counts_each_run_at_the_node_it_stands_or_stopped_at(self) -> None:
        with self.assertNumQueries(1):  # the total, the steps' GROUP BY, the approvals'
            found = self.counts()
        #                        now, waiting, failed, compensated
        assert self.table(found) == {
            "tools": (1, 1, 3, 3),
            "charge_card": (1, 1, 0, 1),
            "reserve_hotel": (0, 0, 1, 1),
            "send_confirmation": (0, 0, 2, 0),
            "lookup_weather": (0, 0, 1, 0),
        }
        assert found.runs == 11  # the window's runs of travel, whatever their status
        assert found.share("reserve_hotel") == 2 / 11
        assert found.share("agent") == 0.0

    def test_it_counts_the_runs_created_in_the_window(self) -> None:
        def reserve(window: str) -> tuple[int, int]:
            found = self.counts(window)
            return found.nodes["reserve_hotel"].failed, found.runs

        assert reserve("1h") == (1, 11)
        assert reserve("24h") == (2, 12)
        assert reserve("7d") == (3, 13)  # not the run of 8 days ago
        with self.assertRaisesMessage(agent_map.UnknownWindow, "choose one of 1h, 24h, 7d"):
            self.counts("30d")

    def test_a_submitter_counts_only_its_own_runs(self) -> None:
        found = self.counts(runs=access.visible_runs(self.bob))
        assert (found.runs, self.table(found)) == (1, {"send_confirmation": (0, 0, 1, 0)})

    def test_the_runs_list_a_click_opens_holds_the_runs_counted(self) -> None:
        found = self.counts()
        since = timezone.now() - timedelta(hours=1)
        for node in ["agent", "tools", *TOOLS, "lookup_weather"]:
            counts = found.nodes.get(node, agent_map.NodeCounts())
            for what in agent_map.STOPS:
                with self.subTest(node=node, what=what):
                    listed = selectors.run_list(runs=Run.objects.all(), agent="travel",
                                                created_after=since, node=node, what=what)
                    assert listed.count() == counts.of(what)
            every = selectors.run_list(runs=Run.objects.all(), agent="travel",
                                       created_after=since, node=node)
            assert every.count() == sum(counts.of(w) for w in agent_map.STOPS)
        failed_at = selectors.run_list(runs=Run.objects.all(), node="reserve_hotel",
                                       what="failed")
        assert {r.pk for r in failed_at} == {self.runs[k].pk for k in (
            "failed", "hours_ago", "days_ago", "weeks_ago")}

    def test_a_batch_over_the_narrowed_list_takes_its_runs_only(self) -> None:
        preview = batches.batch_preview(action="retry", runs=Run.objects.all(), filters={
            "agent": "travel", "node": "reserve_hotel", "what": "failed"})
        assert sorted(preview["runs"]) == sorted(str(self.runs[k].code) for k in (
            "failed", "hours_ago", "days_ago", "weeks_ago"))

    def test_it_lists_the_tools_under_the_tools_node(self) -> None:
        nodes = agent_map.map_nodes(self.counts())
        assert [(n.name, n.parent) for n in nodes] == [
            ("agent", None), ("tools", None), *((t, "tools") for t in TOOLS),
            ("lookup_weather", "tools")]  # from the journal's rows, after the registry's
        checkout = agent_map.map_nodes(agent_map.agent_map(
            runs=Run.objects.all(), agent="checkout", window="1h", now=timezone.now()))
        assert [n.name for n in checkout] == ["create_customer", "charge_user", "book_order"]
        assert checkout[1].counts.failed == 1 and checkout[1].share == 1.0

    def test_its_windows_and_stops_are_the_apis_and_the_lists(self) -> None:
        assert list(agent_map.WINDOWS) == list(Window.__args__)
        assert set(agent_map.WINDOWS) <= set(RANGES)  # a click keeps the window
        assert all(RANGES[k] == v[1] for k, v in agent_map.WINDOWS.items())
        assert list(agent_map.STOPS) == list(Stopped.__args__)


class ApiTests(MapWorld):
    def get(self, who: Any, path: str) -> Any:
        client = Client()
        client.force_login(who)
        return client.get(path)

    def test_it_answers_the_map_as_json(self) -> None:
        response = self.get(self.vera, "/api/agents/travel/map?window=1h")
        assert response.status_code == 200
        body = response.json()
        assert (body["agent"], body["window"], body["runs"]) == ("travel", "1h", 11)
        nodes = {n["name"]: n for n in body["nodes"]}
        assert list(nodes) == ["agent", "tools", *TOOLS, "lookup_weather"]
        assert nodes["reserve_hotel"] == {
            "name": "reserve_hotel", "tool_of": "tools", "now": 0, "waiting": 0, "failed": 1,
            "compensated": 1, "failure_share": round(2 / 11, 4)}
        assert nodes["agent"]["tool_of"] is None
        assert self.get(self.vera, "/api/agents/travel/map").json()["window"] == "24h"

    def test_it_refuses_a_window_it_does_not_know(self) -> None:
        response = self.get(self.vera, "/api/agents/travel/map?window=30d")
        assert response.status_code == 422
        assert response.json()["code"] == "invalid"
        assert "window" in response.json()["detail"] and "'1h'" in response.json()["detail"]

    def test_it_knows_no_agent_it_does_not_offer(self) -> None:
        for name in ("nope", "noop5"):  # noop5: a benchmark agent, not offered
            response = self.get(self.vera, f"/api/agents/{name}/map")
            assert (response.status_code, response.json()["code"]) == (404, "not_found")
            assert "GET /api/agents lists them" in response.json()["detail"]

    def test_a_submitter_gets_its_own_runs_counts(self) -> None:
        body = self.get(self.bob, "/api/agents/travel/map?window=1h").json()
        assert body["runs"] == 1
        assert [n["name"] for n in body["nodes"] if n["failed"]] == ["send_confirmation"]

    def test_the_runs_list_api_narrows_to_a_node(self) -> None:
        body = self.get(self.vera, "/api/runs?agent=travel&node=charge_card&what=waiting").json()
        assert [r["code"] for r in body["items"]] == [str(self.runs["waiting"].code)]
        assert self.get(self.vera, "/api/runs?node=x&what=lost").status_code == 422


class PageTests(MapWorld):
    def setUp(self) -> None:
        self.client.force_login(self.vera)  # a viewer: it sees the map, it acts on nothing

    def test_it_draws_the_graph_with_each_nodes_counts_and_links(self) -> None:
        response = self.client.get("/agents/travel/map?window=1h")
        assert response.status_code == 200
        html = response.content.decode()
        assert '<g class="graph-node st-bad graph-step-under" data-node="reserve_hotel">' in html
        link = "/?agent=travel&amp;node=reserve_hotel&amp;range=1h"
        assert f'<a href="{link}" aria-label="reserve_hotel: ✕ 1  ↩ 1, 18.2 % failed here.' \
               in html
        assert "1 failed at it, 1 compensated after it" in html  # the counts in words
        assert f'<a href="{link}&amp;what=compensated">1</a>' in html  # the table's
        assert '<g class="graph-node st-idle" data-node="agent">' in html  # no failure
        assert 'class="graph-node st-wait graph-current' not in html
        assert "<strong>11</strong> runs of travel created in the last hour" in html
        assert "button" not in html.split('id="map-live"')[1]  # nothing to act on

    def test_it_says_which_window_it_does_not_know(self) -> None:
        response = self.client.get("/agents/travel/map?window=forever")
        assert response.status_code == 400
        assert "There is no window &#x27;forever&#x27;" in response.content.decode()

    def test_it_knows_no_agent_it_does_not_offer(self) -> None:
        assert self.client.get("/agents/nope/map").status_code == 404
        assert self.client.get("/agents/").url == "/agents/checkout/map"

    def test_it_takes_at_most_a_few_queries(self) -> None:
        self.client.get("/agents/travel/map")  # the process's caches: the graph, the shape
        with CaptureQueriesContext(connection) as queries:
            self.client.get("/agents/travel/map?window=7d")
        [counts] = [q["sql"] for q in queries.captured_queries if "UNION ALL" in q["sql"]]
        assert counts.count("UNION ALL") == 2 and counts.count("GROUP BY") == 2
        # with the session, the navigation's, and the versions' unfinished runs (one GROUP BY)
        assert len(queries.captured_queries) <= 11

    def test_the_runs_list_says_what_a_click_narrowed_it_to(self) -> None:
        html = self.client.get("/?agent=travel&node=reserve_hotel&what=failed&range=1h"
                               ).content.decode()
        assert "Runs failed at reserve_hotel" in html
        assert 'href="/agents/travel/map?window=1h"' in html
        assert html.count('data-run="') == 1 and str(self.runs["failed"].code) in html
        assert '<input type="hidden" name="node" value="reserve_hotel">' in html
        every = self.client.get("/?agent=travel&node=tools&range=1h").content.decode()
        assert "Runs that stand or stopped at tools" in every
        assert every.count('data-run="') == 8  # 1 + 1 + 3 + 3


class WithIncidentsFiltersTests(MapWorld):
    """The map's node/what and an Incidents group's step/error_type narrow the same list:
    together they select the runs that meet both, in the selector, the API, the page and a
    batch, and each narrowing's "every run" link drops only its own pair."""

    def setUp(self) -> None:
        self.failed = self.runs["failed"]
        # Its error set: the trigger of migration 0022 records where and with what it failed
        # (its newest failed step: the tools node around the tool call that failed).
        Run.objects.filter(pk=self.failed.pk).update(error={
            "type": "Timeout", "message": "no answer", "traceback": ""})
        self.both = {"node": "reserve_hotel", "what": "failed", "step": "tools",
                     "error_type": "Timeout"}

    def test_the_selector_and_a_batch_take_the_runs_meeting_both(self) -> None:
        listed = selectors.run_list(runs=Run.objects.all(), **self.both)
        assert [r.pk for r in listed] == [self.failed.pk]
        assert not selectors.run_list(runs=Run.objects.all(), **{
            **self.both, "node": "charge_card"}).exists()
        preview = batches.batch_preview(action="retry", runs=Run.objects.all(),
                                        filters=self.both)
        assert preview["runs"] == [str(self.failed.code)]

    def test_the_api_and_the_page_keep_both(self) -> None:
        query = "node=reserve_hotel&what=failed&step=tools&error_type=Timeout"
        client = Client()
        client.force_login(self.vera)
        body = client.get(f"/api/runs?{query}").json()
        assert (body["count"], body["items"][0]["code"]) == (1, str(self.failed.code))
        html = client.get(f"/?{query}").content.decode()
        assert html.count('data-run="') == 1
        assert "Runs failed at reserve_hotel" in html and "data-narrowed" in html
        assert '<input type="hidden" name="node" value="reserve_hotel">' in html
        assert '<input type="hidden" name="error_type" value="Timeout">' in html
        assert 'href="?step=tools&amp;error_type=Timeout"' in html  # less the map's
        assert 'href="?node=reserve_hotel&amp;what=failed"' in html  # less the incident's
