"""Terminate on the run page: an operator's "Terminate…", its confirmation (what stops, and the
undo plan or the hold, as compensate's confirmation says it), and the POST behind it."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone

from stateguard_web.sagas.models import AuditEvent, Run, Step
from tests.web.dashboard.test_views import actions_on
from tests.web.dashboard.world import DashboardWorld


class TerminateTests(DashboardWorld):
    def setUp(self) -> None:
        now = timezone.now()
        self.running = Run.objects.create(
            agent="provision", status=Run.Status.RUNNING, submitted_by=self.alice,
            input={"name": "web-7"}, lease_owner="w1:1:abc",
            lease_expires_at=now + timedelta(seconds=30))
        for seq, (node, status) in enumerate([("create_group", "succeeded"),
                                              ("launch_instance", "succeeded"),
                                              ("attach_address", "started")], 1):
            Step.objects.create(run=self.running, step_id=f"t-{node}", node=node,
                                status=status, started_at=now + timedelta(seconds=seq),
                                done_seq=seq if status == "succeeded" else None)

    def dialog(self, html: str) -> str:
        found = re.search(r'<dialog id="confirm-terminate".*?</dialog>', html, re.S)
        assert found is not None
        return found[0]

    def test_it_says_what_stops_and_what_is_undone_newest_first(self) -> None:
        html = self.client_for("charlie").get(self.url(self.running)).content.decode()
        assert actions_on(html) == ["terminate"]
        assert 'data-dialog="confirm-terminate">Terminate…</button>' in html
        dialog = self.dialog(html)
        assert "a step running now finishes first" in dialog
        assert re.findall(r'data-undo="(\w+)"', dialog) == [
            "attach_address", "launch_instance", "create_group"]  # newest first
        assert "attach_address running now: once it finished" in dialog
        assert re.findall(r'name="then" value="(\w+)"( checked)?', dialog) == [
            ("unwind", " checked"), ("hold", "")]
        for who in ["vera", "alice"]:  # a viewer and the submitter are offered nothing
            html = self.client_for(who).get(self.url(self.running)).content.decode()
            assert actions_on(html) == [] and "confirm-terminate" not in html

    def test_past_its_pivot_it_offers_to_hold_only(self) -> None:
        Step.objects.filter(run=self.running, node="launch_instance").update(kind="pivot")
        dialog = self.dialog(self.client_for("charlie").get(self.url(self.running))
                             .content.decode())
        assert re.findall(r'name="then" value="(\w+)"', dialog) == ["hold"]
        assert "it passed its pivot <strong>launch_instance</strong>" in dialog

    def test_confirming_leaves_the_request_and_says_so(self) -> None:
        client = self.client_for("charlie")
        response = client.post(self.url(self.running, "terminate"),
                               {"then": "unwind", "reason": "wrong size"}, follow=True)
        assert "the worker stops the run at its next step, then unwinds it" in (
            response.content.decode())
        self.running.refresh_from_db()
        assert (self.running.request["action"], self.running.request["then"]) == (
            "terminate", "unwind")
        assert 'data-request="terminate by charlie"' in response.content.decode()
        assert AuditEvent.objects.get(run=self.running).data == {"then": "unwind",
                                                                 "reason": "wrong size"}

    def test_a_pending_run_is_cancelled_at_once(self) -> None:
        pending = Run.objects.create(agent="provision", submitted_by=self.alice,
                                     input={"name": "web-8"})
        client = self.client_for("charlie")
        dialog = self.dialog(client.get(self.url(pending)).content.decode())
        assert "It has not started, and it never will" in dialog
        response = client.post(self.url(pending, "terminate"), {"then": "hold"}, follow=True)
        assert "it waits for you, needing attention" in response.content.decode()
        assert Run.objects.get(pk=pending.pk).status == Run.Status.NEEDS_ATTENTION

    def test_a_bad_form_or_a_refusal_changes_nothing(self) -> None:
        client = self.client_for("charlie")
        for data, said in [({}, "Choose what happens once the run stopped"),
                           ({"then": "explode"}, "Choose what happens once the run stopped"),
                           ({"then": "hold", "reason": "x" * 2001}, "longer than 2000")]:
            response = client.post(self.url(self.running, "terminate"), data, follow=True)
            assert said in response.content.decode(), data
        response = client.post(self.url(self.failed, "terminate"), {"then": "hold"},
                               follow=True)
        assert "only a pending or running run is terminated" in response.content.decode()
        assert self.client_for("vera").post(self.url(self.running, "terminate"),
                                            {"then": "hold"}).status_code == 403
        assert not AuditEvent.objects.filter(run__in=[self.running, self.failed]).exists()
        assert Run.objects.get(pk=self.running.pk).request is None
