"""The runs list an operator lives in: its orders, several statuses at once, saved views, the
CSV export of what it shows, and GET /api/runs taking the same parameters."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from typing import Any

from django.db import connection
from django.test import Client, TestCase, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard_web.accounts.models import SavedView
from stateguard_web.accounts.services import MAX_SAVED_VIEWS
from stateguard_web.runs import selectors
from stateguard_web.sagas.models import Run
from tests.web.api.world import make_user
from tests.web.dashboard.world import DashboardWorld

LISTED = re.compile(r'<tr id="run-([0-9a-f-]+)"')


def listed(html: str) -> list[str]:
    return LISTED.findall(html)


def exported(response: Any) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


class Timed(TestCase):
    """Six runs with times apart. Created a minute apart, newest first: p (paused, checkout),
    f (failed, provision), q (pending: no worker took it), s (needs attention, provision),
    sc (succeeded, checkout), b (succeeded, provision, bob's). Durations: s 210 s (to its
    outcome), f 60 s and p 30 s (to their last change), sc 20 s, b 5 s, q none."""

    @classmethod
    def setUpTestData(cls) -> None:
        cls.alice = make_user("alice", "submitter")
        cls.bob = make_user("bob", "submitter")
        cls.vera = make_user("vera", "viewer")
        cls.charlie = make_user("charlie", "operator")
        cls.nobody = make_user("nobody")
        now = timezone.now()

        def ago(minutes: float) -> Any:
            return now - timedelta(minutes=minutes)

        def run(agent: str, status: str, created: float, updated: float,
                finished: float | None = None, by: Any = None, **input: str) -> Run:
            # started_at and finished_at are set once (triggers: migrations 0012, 0024), at
            # the insert; created_at and updated_at are the models', set after.
            made = Run.objects.create(
                agent=agent, status=status, input=input, submitted_by=by or cls.alice,
                started_at=None if status == Run.Status.PENDING else ago(created),
                finished_at=None if finished is None else ago(finished))
            Run.objects.filter(pk=made.pk).update(created_at=ago(created),
                                                  updated_at=ago(updated))
            return made

        S = Run.Status
        cls.p = run("checkout", S.PAUSED, 1, 0.5)
        cls.f = run("provision", S.FAILED, 2, 1, name="web-2")
        cls.q = run("provision", S.PENDING, 3, 3)
        cls.s = run("provision", S.NEEDS_ATTENTION, 4, 0.2, finished=0.5, name="web-3")
        cls.sc = run("checkout", S.SUCCEEDED, 5, 4, finished=5 - 20 / 60)
        cls.b = run("provision", S.SUCCEEDED, 6, 6 - 5 / 60, finished=6 - 5 / 60, by=cls.bob,
                    name="bobs-box")

    def client_for(self, who: str | None) -> Client:
        client = Client()
        if who is not None:
            client.force_login(getattr(self, who))
        return client

    def codes(self, *runs: Run) -> list[str]:
        return [str(r.code) for r in runs]


class SortTests(Timed):
    def test_it_sorts_by_each_column_both_ways(self) -> None:
        p, f, q, s, sc, b = self.p, self.f, self.q, self.s, self.sc, self.b
        orders = {
            "-created": [p, f, q, s, sc, b], "created": [b, sc, s, q, f, p],
            "-updated": [s, p, f, q, sc, b], "updated": [b, sc, q, f, p, s],
            # longest first, the run no worker took last; the reverse is the exact reverse
            "-duration": [s, f, p, sc, b, q], "duration": [q, b, sc, p, f, s],
            # names from A, each agent's newest first; the reverse is the exact reverse
            "agent": [p, sc, f, q, s, b], "-agent": [b, s, q, f, sc, p],
            "status": [f, s, p, q, sc, b], "-status": [b, sc, q, p, s, f],
        }
        client = self.client_for("vera")
        for sort, runs in orders.items():
            with self.subTest(sort=sort):
                assert listed(client.get("/", {"sort": sort}).content.decode()) == \
                    self.codes(*runs)
                selected = selectors.run_list(runs=Run.objects.all(), sort=sort)
                assert [r.code for r in selected] == [r.code for r in runs]

    def test_its_headings_sort_and_say_how(self) -> None:
        html = self.client_for("vera").get("/", {"sort": "-duration",
                                                 "status": "failed"}).content.decode()
        heading = re.search(r'<th scope="col" class="col-duration" aria-sort="descending" '
                            r'data-sort="duration"><a class="sort" href="([^"]+)"', html)
        assert heading is not None  # a second click: the other way, the filter kept
        assert heading.group(1).replace("&amp;", "&") == "?sort=duration&status=failed"
        created = re.search(r'data-sort="created"><a class="sort" href="([^"]+)"', html)
        assert created is not None and "sort=-created" in created.group(1)
        assert 'aria-sort' not in html.split('data-sort="created"')[0].rsplit("<th", 1)[1]
        assert '<td class="col-duration">1 min 0 s</td>' in html
        # The filter form and the pager keep the order.
        assert '<input type="hidden" name="sort" value="-duration">' in html

    def test_its_queries_do_not_grow_with_its_rows_in_any_order(self) -> None:
        """The submitters are read after the sort, for the page's rows only: one query, however
        many people submitted them (``selectors.run_list``)."""
        client = self.client_for("vera")
        for sort in ("-updated", "agent"):
            with self.subTest(sort=sort), CaptureQueriesContext(connection) as before:
                client.get("/", {"sort": sort})
            for i in range(3):
                Run.objects.create(agent="checkout", input={},
                                   submitted_by=make_user(f"shop-{sort}-{i}", "submitter"))
            with self.subTest(sort=sort), CaptureQueriesContext(connection) as after:
                html = client.get("/", {"sort": sort}).content.decode()
            assert len(after) == len(before) and f"shop-{sort}-2" in html

    def test_it_shows_a_bad_order_and_lists_newest_first(self) -> None:
        response = self.client_for("vera").get("/", {"sort": "colour"})
        assert response.status_code == 200
        html = response.content.decode()
        assert "Sort: Select a valid choice. colour is not one of the available choices. " \
               "(ignored)" in html
        assert listed(html)[0] == str(self.p.code)

    def test_it_pages_in_its_order(self) -> None:
        Run.objects.bulk_create([Run(agent="a-first", input={}) for _ in range(52)])
        client = self.client_for("vera")
        first = client.get("/", {"sort": "agent"}).content.decode()
        assert 'rel="next" href="?sort=agent&amp;page=2"' in first
        second = client.get("/", {"sort": "agent", "page": 2}).content.decode()
        assert listed(second)[2:] == self.codes(self.p, self.sc, self.f, self.q, self.s,
                                                self.b)


class StatusesTests(Timed):
    def test_it_lists_several_statuses_at_once_with_their_chips_on(self) -> None:
        html = self.client_for("vera").get(
            "/?status=failed&status=needs_attention&sort=created").content.decode()
        assert listed(html) == self.codes(self.s, self.f)
        assert re.findall(r'aria-current="true" data-chip="(\w+)"', html) == [
            "failed", "needs_attention"]
        assert "2 runs" in html

    def test_a_chip_adds_its_status_or_takes_it_out(self) -> None:
        html = self.client_for("vera").get("/?status=failed&agent=provision").content.decode()
        links = {status: href.replace("&amp;", "&") for href, status in re.findall(
            r'<a class="chip[^"]*" href="([^"]*)"[^>]*data-chip="(\w*)"', html)}
        assert links["needs_attention"] == (
            "?status=failed&status=needs_attention&agent=provision")
        assert links["failed"] == "?agent=provision"
        assert links[""] == "?agent=provision"

    def test_a_batch_of_this_filter_takes_every_status_chosen(self) -> None:
        response = self.client_for("charlie").get("/batches/new", {
            "action": "compensate", "scope": "filter", "status": ["failed", "needs_attention"],
            "sort": "agent"})
        html = response.content.decode()
        assert response.status_code == 200
        assert "The runs, failed or needs attention now." in html
        assert str(self.f.code) in html and str(self.s.code) in html


class ExportTests(Timed):
    def test_it_exports_the_filtered_list_in_its_order(self) -> None:
        response = self.client_for("vera").get(
            "/runs.csv", {"status": ["failed", "needs_attention", "succeeded"],
                          "sort": "-duration", "agent": "provision"})
        assert response.status_code == 200 and response.streaming
        assert response["Content-Type"] == "text/csv; charset=utf-8"
        assert response["Content-Disposition"].startswith('attachment; filename="runs-')
        assert response["X-Truncated"] == "false"
        rows = exported(response)
        assert [r["run"] for r in rows] == self.codes(self.s, self.f, self.b)
        stuck = rows[0]
        assert stuck["status"] == "needs_attention" and stuck["agent"] == "provision"
        assert stuck["duration_seconds"] == "210.000" and stuck["submitted_by"] == "alice"
        assert stuck["input"] == '{"name": "web-3"}'
        assert stuck["finished_at"] == self.s.finished_at.isoformat()
        pending = exported(self.client_for("vera").get("/runs.csv", {"status": "pending"}))
        assert [(r["run"], r["started_at"], r["duration_seconds"]) for r in pending] == [
            (str(self.q.code), "", "")]

    def test_it_stops_at_its_row_limit_and_says_so(self) -> None:
        with override_settings(STATEGUARD_RUNS_CSV_MAX_ROWS=3):
            response = self.client_for("vera").get("/runs.csv", {"sort": "created"})
        rows = exported(response)
        assert response["X-Truncated"] == "true" and response["X-Row-Limit"] == "3"
        assert [r["run"] for r in rows] == self.codes(self.b, self.sc, self.s)

    def test_it_exports_only_what_the_user_may_see(self) -> None:
        rows = exported(self.client_for("bob").get("/runs.csv"))
        assert [r["run"] for r in rows] == self.codes(self.b)
        assert self.client_for("nobody").get("/runs.csv").status_code == 403
        assert self.client_for(None).get("/runs.csv").status_code == 302  # to the login

    def test_it_refuses_bad_parameters_with_a_400_that_says_which(self) -> None:
        response = self.client_for("vera").get("/runs.csv", {"status": "lost", "sort": "x"})
        assert response.status_code == 400
        text = response.content.decode()
        assert text.startswith("The export's parameters are wrong:\n")
        assert "Status: Select a valid choice. lost is not one" in text
        assert "Sort: Select a valid choice. x is not one" in text

    def test_it_writes_no_cell_a_spreadsheet_would_run(self) -> None:
        Run.objects.filter(pk=self.b.pk).update(agent="=HYPERLINK(\"http://x\")",
                                                   input={"a": "=1+1"})
        rows = exported(self.client_for("vera").get("/runs.csv", {"q": "bobs"}))
        assert rows == []  # the input no longer says bobs-box
        rows = exported(self.client_for("vera").get("/runs.csv", {"sort": "created"}))
        assert rows[0]["agent"] == "'=HYPERLINK(\"http://x\")"
        assert rows[0]["input"] == '{"a": "=1+1"}'  # a JSON object starts with {


class SavedViewTests(DashboardWorld):
    def save(self, who: str, name: str, query: str) -> Any:
        client = self.client_for(who, csrf=True)
        client.get("/")
        return client.post("/views/", {"name": name, "query": query,
                                       "csrfmiddlewaretoken": client.cookies["csrftoken"].value})

    def test_a_user_saves_the_list_and_opens_it_from_the_menu(self) -> None:
        response = self.save("vera", "my checkout failures today",
                             "status=failed&agent=checkout&range=24h&page=4&evil=1")
        assert response.status_code == 302
        assert response["Location"] == "/?status=failed&agent=checkout&range=24h"
        view = SavedView.objects.get()
        assert (view.user, view.query) == (self.vera, "status=failed&agent=checkout&range=24h")
        html = self.client_for("vera").get("/").content.decode()
        assert ('<li data-view="my checkout failures today"><a href="/?status=failed&amp;'
                'agent=checkout&amp;range=24h">my checkout failures today</a>') in html
        # The same name again: its query now.
        self.save("vera", "my checkout failures today", "status=paused")
        assert SavedView.objects.get().query == "status=paused"

    def test_each_user_sees_and_deletes_their_own_only(self) -> None:
        self.save("vera", "veras", "status=failed")
        self.save("charlie", "charlies", "status=paused")
        html = self.client_for("charlie").get("/").content.decode()
        assert 'data-view="charlies"' in html and "veras" not in html
        veras = SavedView.objects.get(name="veras")
        client = self.client_for("charlie")
        assert client.post(f"/views/{veras.pk}/delete").status_code == 404
        assert SavedView.objects.filter(pk=veras.pk).exists()
        assert self.client_for("vera").post(f"/views/{veras.pk}/delete").status_code == 302
        assert not SavedView.objects.filter(pk=veras.pk).exists()

    def test_it_wants_the_csrf_token_a_post_and_a_name(self) -> None:
        client = self.client_for("vera", csrf=True)
        assert client.post("/views/", {"name": "x", "query": ""}).status_code == 403
        assert self.client_for("vera").get("/views/").status_code == 405
        response = self.client_for("vera").post("/views/", {"name": " ", "query": "q=a"},
                                                follow=True)
        assert "Name the view (at most 100 characters) to save it." in (
            response.content.decode())
        assert not SavedView.objects.exists()

    def test_it_saves_no_view_of_bad_parameters_nor_too_many(self) -> None:
        response = self.client_for("vera").post("/views/", {"name": "bad",
                                                            "query": "status=lost"},
                                                follow=True)
        assert "Not saved: Status: Select a valid choice." in response.content.decode()
        assert not SavedView.objects.exists()
        SavedView.objects.bulk_create([SavedView(user=self.vera, name=f"v{i}")
                                       for i in range(MAX_SAVED_VIEWS)])
        response = self.client_for("vera").post("/views/", {"name": "one more", "query": ""},
                                                follow=True)
        assert f"You have {MAX_SAVED_VIEWS} saved views: delete one first." in (
            response.content.decode())
        assert SavedView.objects.count() == MAX_SAVED_VIEWS


class ApiTests(Timed):
    def test_the_api_takes_the_lists_parameters(self) -> None:
        client = self.client_for("vera")  # the dashboard's session will do
        response = client.get("/api/runs?status=failed&status=needs_attention&sort=-duration")
        assert response.status_code == 200, response.content
        data = response.json()
        assert [r["code"] for r in data["items"]] == self.codes(self.s, self.f)
        assert data["count"] == 2
        for query, loc in [("sort=colour", ["query", "sort"]),
                           ("status=failed&status=lost", ["query", "status", 1]),
                           ("range=custom&before=9999-12-31", ["query", "before"])]:
            with self.subTest(query=query):
                bad = client.get(f"/api/runs?{query}")
                assert bad.status_code == 422, bad.content
                assert loc in [e["loc"] for e in bad.json()["errors"]]
