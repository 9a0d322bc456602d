"""The timeline on a run's page (dashboard/timeline_svg.py): drawn from the rows the page reads
anyway, so it costs the page no query; a bar per step and compensation, each a link to its row."""

from __future__ import annotations

import re

from tests.web.dashboard.world import DashboardWorld

# What the run page of a run with steps, compensations and attempts asks the database, for a
# viewer: the session, the user, its permissions, the run, its steps, compensations, their
# attempts, its approvals, effects, audit, the navigation's three counts. The same as before
# the timeline: it reads nothing of its own.
RUN_PAGE_QUERIES = 13


class TimelinePageTests(DashboardWorld):
    def test_it_draws_each_step_and_compensation_at_no_cost_in_queries(self) -> None:
        client = self.client_for("vera")
        client.get(self.url(self.stuck))  # the process's first page: warm caches
        with self.assertNumQueries(RUN_PAGE_QUERIES) as queries:
            response = client.get(self.url(self.stuck))
        # The attempts are read by their compensations alone, with no join for an ordering.
        (attempts,) = [q["sql"] for q in queries.captured_queries
                       if 'FROM "sagas_compensationattempt"' in q["sql"]]
        assert "JOIN" not in attempts
        html = response.content.decode()
        bars = re.findall(r'<a class="tl-bar [^"]*" href="([^"]+)" data-kind="(\w+)" '
                          r'data-name="(\w+)" data-status="(\w+)"', html)
        steps = {s.node: s.pk for s in self.stuck.steps.all()}
        assert bars == [
            (f"#step-{steps['create_group']}", "step", "create_group", "succeeded"),
            (f"#step-{steps['launch_instance']}", "step", "launch_instance", "succeeded"),
            (f"#step-{steps['attach_address']}", "step", "attach_address", "succeeded"),
            (f"#comp-{self.compensation.pk}", "compensation", "attach_address", "failed"),
            (f"#comp-{self.compensation.pk + 1}", "compensation", "launch_instance",
             "succeeded")]
        # The rows the bars link to are on the page.
        for href, *_ in bars:
            assert f'id="{href[1:]}"' in html
        assert 'aria-label="Undo of attach_address: compensation failed, took 0 ms. 1 attempt"' \
            in html
        # Three steps of 340 ms each (world.py): where the time went, in words.
        assert re.search(r"<figcaption[^>]*>[^<]*: steps 1\.0 s, compensating", html)

    def test_a_run_with_nothing_journaled_has_no_timeline(self) -> None:
        html = self.client_for("vera").get(self.url(self.bobs)).content.decode()
        assert "data-timeline" not in html and "No step has started yet" in html
