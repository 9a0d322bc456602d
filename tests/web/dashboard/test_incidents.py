"""The Incidents page: its groups per role (an operator's batch links, a viewer's none, a
submitter's own runs), its sparklines, and a group's way to its runs and to a batch over them."""

from __future__ import annotations

import html
import re
from datetime import timedelta

from django.utils import timezone

from stateguard_web.sagas.models import Batch, Run
from tests.web.dashboard.test_batches import button, confirmed_runs
from tests.web.dashboard.world import SCRIPT, DashboardWorld
from tests.web.incident_world import incident


def groups(page: str) -> list[tuple[str, ...]]:
    """Each group's agent, step, error type, status and count, as the page lists them."""
    return re.findall(r'data-incident data-agent="([^"]*)" data-step="([^"]*)" '
                      r'data-error-type="([^"]*)" data-status="([^"]*)" data-count="(\d+)"',
                      page)


def links(page: str, marker: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(rf'href="([^"]+)" {marker}', page)]


class IncidentPageTests(DashboardWorld):
    @classmethod
    def setUpTestData(cls) -> None:
        super().setUpTestData()  # a failed provision run, one that needs attention
        now = timezone.now()
        cls.down = [incident("checkout", "charge_user", "APIConnectionError",
                             at=now - timedelta(hours=h), by=cls.bob,
                             message="Unexpected error communicating with Stripe: "
                                     "connection refused")
                    for h in (3, 2, 1)]
        cls.odd = incident("checkout", "book", f"Bad{SCRIPT}", status="needs_attention",
                           message=SCRIPT)

    def test_it_shows_an_operator_the_groups_and_a_batch_for_each(self) -> None:
        response = self.client_for("charlie").get("/incidents/")
        assert response.status_code == 200
        page = response.content.decode()
        assert groups(page)[0] == ("checkout", "charge_user", "APIConnectionError", "failed",
                                   "3")
        assert len(groups(page)) == 4
        assert "Stripe unreachable (connection refused)" in page  # the newest run's, in words
        retry = ("/batches/new?action=retry&scope=filter&status=failed&agent=checkout"
                 "&step=charge_user&error_type=APIConnectionError")
        assert links(page, 'data-batch="retry"')[0] == retry
        assert '>Retry 3 runs…</a>' in page and '>Compensate 3 runs…</a>' in page
        # A group that needs attention offers its failed compensations to be retried.
        assert links(page, 'data-batch="retry_compensations"')[0].startswith(
            "/batches/new?action=retry_compensations&scope=filter&status=needs_attention")
        assert SCRIPT not in page  # an error type and message from outside, escaped
        assert 'aria-current="page">Incidents</a>' in page

    def test_it_draws_each_sparkline_as_markup_the_csp_allows(self) -> None:
        page = self.client_for("charlie").get("/incidents/").content.decode()
        svgs = re.findall(r"<svg class=\"spark\".*?</svg>", page)
        assert len(svgs) == 4
        assert all("style" not in svg and "<script" not in svg for svg in svgs)
        assert 'aria-label="3 runs got here in this window; the most, 1, from ' in svgs[0]
        assert svgs[0].count('class="spark-bar') == 3  # one bar per hour with a run

    def test_a_viewer_sees_the_groups_without_actions(self) -> None:
        page = self.client_for("vera").get("/incidents/").content.decode()
        assert len(groups(page)) == 4
        assert "data-batch" not in page and "/batches/new" not in page
        assert links(page, "data-runs-link")  # the runs, to look at

    def test_a_submitter_sees_its_own_and_a_stranger_nothing(self) -> None:
        page = self.client_for("bob").get("/incidents/").content.decode()
        assert [g[1:] for g in groups(page)] == [("charge_user", "APIConnectionError",
                                                  "failed", "3")]
        assert self.client_for("nobody").get("/incidents/").status_code == 403
        assert self.client_for(None).get("/incidents/").url.startswith("/login/")

    def test_it_narrows_and_ignores_what_it_does_not_know(self) -> None:
        client = self.client_for("vera")
        page = client.get("/incidents/", {"status": "needs_attention", "window": "7d",
                                          "sort": "recent"}).content.decode()
        assert {g[3] for g in groups(page)} == {"needs_attention"}
        assert "over the last 7 days" in page
        odd = client.get("/incidents/", {"window": "1y", "status": "succeeded",
                                         "sort": "x" * 500, "agent": "nope"})
        assert odd.status_code == 200 and "No incident matches these filters." in (
            odd.content.decode())

    def test_a_group_opens_its_runs_and_a_batch_over_them(self) -> None:
        client = self.client_for("charlie")
        page = client.get("/incidents/").content.decode()
        runs = client.get(links(page, "data-runs-link")[0]).content.decode()
        listed = re.findall(r'<tr id="run-([0-9a-f-]+)"', runs)
        assert sorted(listed) == sorted(str(r.code) for r in self.down)
        assert "Runs that last failed at charge_user with APIConnectionError" in runs
        assert 'name="step" value="charge_user"' in runs  # kept by the filter form
        confirm = client.get(links(page, 'data-batch="retry"')[0]).content.decode()
        assert "Retry 3 runs?" in confirm and button(confirm) == "Retry 3 runs"
        assert ("The runs of checkout that last failed at charge_user with "
                "APIConnectionError, failed now.") in confirm
        assert sorted(confirmed_runs(confirm)) == sorted(str(r.code) for r in self.down)
        assert not Batch.objects.exists()
        with self.captureOnCommitCallbacks(execute=False):
            made = client.post("/batches/", {"action": "retry",
                                             "runs": ",".join(confirmed_runs(confirm))})
        batch = Batch.objects.get()
        assert made.url == f"/batches/{batch.code}/"
        assert batch.items.count() == 3 and batch.action == "retry"
        assert Run.objects.filter(status="failed", failed_node="charge_user").count() == 3
