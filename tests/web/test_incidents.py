"""Incidents: where and how each failed or needs-attention run failed, kept by the trigger of
migration 0022 whichever write gets it there, and the runs grouped by it in one indexed
statement (``runs/incidents.py``), each group's filter selecting exactly its runs."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stateguard import SagaAborted, StateGuardCheckpointer
from stateguard_web.runs import incidents, selectors
from stateguard_web.sagas.journal import DjangoJournal
from stateguard_web.sagas.models import Run, Step
from tests.core.support import FAST_RETRY, config, line_builder
from tests.web.api.world import make_user
from tests.web.conftest import new_run
from tests.web.incident_world import incident
from tests.web.test_step_rows import deferring

NODES = ["a", "b", "c"]


def columns(code: str) -> tuple[object, ...]:
    run = Run.objects.get(code=code)
    return run.status, run.failed_node, run.error_type, run.incident_at == run.updated_at


@pytest.mark.django_db(transaction=True)
def test_it_records_where_a_run_held_by_the_deferring_journal_failed_and_keeps_it() -> None:
    journal, saver = deferring()  # the worker's journal: step rows go with the checkpoints
    code = new_run()
    fail = {"b": True}

    def b_body(state: dict[str, object]) -> dict[str, object]:
        if fail["b"]:
            raise ConnectionError("provider down")
        return {}

    guard = StateGuardCheckpointer(saver, journal=journal, on_error="hold")
    graph = guard.compile(line_builder(NODES, [], {"b": b_body}))
    with pytest.raises(ConnectionError):
        guard.invoke(graph, {}, config(code))
    assert columns(code) == ("failed", "b", "ConnectionError", True)

    fail["b"] = False
    guard.retry(graph, config(code))  # where it last failed stays said
    assert columns(code)[:3] == ("succeeded", "b", "ConnectionError")


@pytest.mark.django_db(transaction=True)
def test_it_records_where_a_run_whose_compensation_failed_had_failed() -> None:
    code = new_run()

    def broken(state: object, ctx: object) -> bool:
        raise OSError("refund API down")

    guard = StateGuardCheckpointer(journal=DjangoJournal(), compensation_retry=FAST_RETRY,
                                   compensations={"a": broken})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(line_builder(NODES, [])), {"fail_at": "c"}, config(code))
    assert columns(code) == ("needs_attention", "c", "ValueError", True)


class TriggerTests(TestCase):
    def test_it_follows_the_status_and_the_error_and_nothing_else(self) -> None:
        now = timezone.now()
        run = incident("checkout", "charge_user", "APIConnectionError", at=now)
        assert (run.failed_node, run.error_type, run.incident_at) == (
            "charge_user", "APIConnectionError", now)
        runs = Run.objects.filter(pk=run.pk)

        # A write of the columns themselves is put back: only the trigger says them.
        runs.update(failed_node="else", error_type="Else", incident_at=now - timedelta(days=9))
        run.refresh_from_db()
        assert (run.failed_node, run.error_type, run.incident_at) == (
            "charge_user", "APIConnectionError", now)

        # The error reworded (held past its pivot): its type is followed, the time kept.
        runs.update(status=Run.Status.NEEDS_ATTENTION, updated_at=now + timedelta(minutes=1))
        runs.update(error={"type": "CardError", "message": "declined; not unwound"},
                    updated_at=now + timedelta(minutes=2))
        run.refresh_from_db()
        assert (run.error_type, run.incident_at) == ("CardError", now + timedelta(minutes=1))

        # Retried: the run keeps where it last failed; failing again elsewhere moves it.
        runs.update(status=Run.Status.RUNNING)
        Step.objects.create(run=run, step_id="again", node="book", status=Step.Status.FAILED,
                            started_at=now + timedelta(minutes=5),
                            finished_at=now + timedelta(minutes=5))
        runs.update(status=Run.Status.SUCCEEDED)
        run.refresh_from_db()
        assert (run.failed_node, run.error_type) == ("charge_user", "CardError")
        runs.update(status=Run.Status.FAILED, error=None, updated_at=now + timedelta(hours=1))
        run.refresh_from_db()
        assert (run.failed_node, run.error_type, run.incident_at) == (
            "book", "", now + timedelta(hours=1))

    def test_it_says_none_for_a_run_made_failed_or_never_failed(self) -> None:
        made = Run.objects.create(agent="provision", status=Run.Status.FAILED,
                                  error={"type": "UnknownAgent", "message": "gone"})
        fine = Run.objects.create(agent="provision", status=Run.Status.SUCCEEDED)
        made.refresh_from_db()
        fine.refresh_from_db()
        assert (made.failed_node, made.error_type, made.incident_at) == (
            "", "UnknownAgent", made.updated_at)
        assert (fine.failed_node, fine.error_type, fine.incident_at) == (None, None, None)

    def test_it_takes_an_unfinished_step_when_none_failed(self) -> None:
        run = Run.objects.create(agent="provision", status=Run.Status.RUNNING)
        at = timezone.now()
        Step.objects.create(run=run, step_id="s1", node="create_group", started_at=at,
                            status=Step.Status.SUCCEEDED, finished_at=at)
        Step.objects.create(run=run, step_id="s2", node="launch_instance", started_at=at,
                            status=Step.Status.STARTED)  # its worker died in it
        Run.objects.filter(pk=run.pk).update(status=Run.Status.NEEDS_ATTENTION)
        run.refresh_from_db()
        assert (run.failed_node, run.error_type) == ("launch_instance", "")


class IncidentGroupTests(TestCase):
    @classmethod
    def setUpTestData(cls) -> None:
        cls.now = now = timezone.now()
        cls.alice = make_user("alice", "submitter")
        hour = timedelta(hours=1)
        cls.charge = [incident("checkout", "charge_user", "APIConnectionError",
                               at=now - h * hour, message=f"down {h}",
                               by=cls.alice if h == 30 else None)
                      for h in (30, 2, 1)]
        cls.card = incident("checkout", "charge_user", "CardError", at=now - 3 * hour)
        cls.book = [incident("checkout", "book", "BookingFailed", at=now - h * hour,
                             status=Run.Status.NEEDS_ATTENTION) for h in (5, 4)]
        cls.bare = incident("provision", "", "", at=now - 200 * hour)
        retried = incident("checkout", "charge_user", "APIConnectionError", at=now)
        Run.objects.filter(pk=retried.pk).update(status=Run.Status.SUCCEEDED)

    def groups(self, **kwargs: object) -> incidents.IncidentPage:
        return incidents.incident_groups(runs=Run.objects.all(), now=self.now, **kwargs)

    def test_it_groups_by_agent_step_error_and_status_the_largest_first(self) -> None:
        page = self.groups()
        assert [(g.agent, g.step, g.error_type, g.status, g.count) for g in page.groups] == [
            ("checkout", "charge_user", "APIConnectionError", "failed", 3),
            ("checkout", "book", "BookingFailed", "needs_attention", 2),
            ("checkout", "charge_user", "CardError", "failed", 1),
            ("provision", "", "", "failed", 1)]
        charge = page.groups[0]
        assert (charge.first_seen, charge.last_seen) == (self.charge[0].incident_at,
                                                         self.charge[2].incident_at)
        assert (charge.sample, charge.sample_run) == ("down 1", self.charge[2].code)
        # 24 bars of an hour: the runs of 2 h and 1 h ago; the one of 30 h ago is before it.
        assert len(charge.bars) == 24 and charge.recent == 2
        assert charge.bars[-2:] == (1, 1) and not any(charge.bars[:-2])
        assert page.groups[3].filters == {"status": "failed", "agent": "provision",
                                          "step": "-", "error_type": "-"}
        assert not page.more and page.runs == 7

    def test_it_narrows_sorts_limits_and_shows_a_submitter_its_own(self) -> None:
        assert [g.count for g in self.groups(status="needs_attention").groups] == [2]
        assert [g.agent for g in self.groups(agent="provision").groups] == ["provision"]
        recent = self.groups(sort="recent", window="30d").groups
        assert [g.error_type for g in recent] == ["APIConnectionError", "CardError",
                                                 "BookingFailed", ""]
        assert len(recent[0].bars) == 30 and recent[0].recent == 3
        limited = self.groups(limit=2)
        assert len(limited.groups) == 2 and limited.more
        own = incidents.incident_groups(runs=Run.objects.filter(submitted_by=self.alice))
        assert [(g.count, g.sample_run) for g in own.groups] == [(1, self.charge[0].code)]

    def test_each_groups_filter_selects_exactly_its_runs(self) -> None:
        for group in self.groups().groups:
            runs = selectors.run_list(runs=Run.objects.all(), **group.filters)
            assert runs.count() == group.count, group
        failed_at = selectors.run_list(runs=Run.objects.all(), step="charge_user")
        assert failed_at.count() == 5  # the one retried since too: where it last failed

    def test_it_reads_the_groups_and_their_newest_runs_on_the_partial_index(self) -> None:
        with CaptureQueriesContext(connection) as queries:
            self.groups()
        grouped, newest = (q["sql"] for q in queries.captured_queries)
        with connection.cursor() as cursor:
            # A table this small is read whole; told not to, the planner must be able to use
            # the index alone for the groups, and an index for each group's newest run (a
            # probe by its whole key). bench/cockpit_incidents.py shows the plans at scale.
            cursor.execute("SET LOCAL enable_seqscan = off")
            plans = []
            for sql, bitmaps in ((grouped, "off"), (newest, "on")):
                cursor.execute(f"SET LOCAL enable_bitmapscan = {bitmaps}")
                cursor.execute("EXPLAIN " + sql)
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
        assert "Index Only Scan using sagas_run_incidents" in plans[0], plans[0]
        assert "SubPlan" not in plans[0] and "Seq Scan" not in plans[1], plans
        # either of the indexes that hold the whole key (migration 0022)
        assert re.search(r"Index Scan (on|using) sagas_run_(incidents|failed_at)", plans[1]), (
            plans[1])
