"""The admin shows the journal to staff and lets nobody edit it there."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import TestCase

from stateguard_web.sagas.models import Compensation, CompensationAttempt, Run, Step


class AdminTests(TestCase):
    def setUp(self) -> None:
        self.alice = get_user_model().objects.create_superuser("alice", password="pw")
        self.client.force_login(self.alice)
        self.run = Run.objects.create(agent="provision", status=Run.Status.COMPENSATED)
        step = Step.objects.create(run=self.run, step_id="t1", node="create_group",
                                   status="succeeded", started_at=self.run.created_at)
        comp = Compensation.objects.create(run=self.run, step=step, node=step.node,
                                           idempotency_key="sg-1", status="succeeded")
        CompensationAttempt.objects.create(compensation=comp, number=1, ok=True,
                                           started_at=self.run.created_at,
                                           finished_at=self.run.created_at)
        self.comp = comp

    def test_it_lists_and_shows_runs_with_their_steps_and_compensations(self) -> None:
        listing = self.client.get("/admin/sagas/run/?status__exact=compensated")
        assert listing.status_code == 200 and str(self.run.code) in listing.content.decode()
        detail = self.client.get(f"/admin/sagas/run/{self.run.pk}/change/")
        page = detail.content.decode()
        assert detail.status_code == 200 and "create_group" in page and "sg-1" in page
        comp = self.client.get(f"/admin/sagas/compensation/{self.comp.pk}/change/")
        assert comp.status_code == 200

    def test_it_refuses_to_edit_or_delete_the_journal(self) -> None:
        assert self.client.get("/admin/sagas/run/add/").status_code == 403
        response = self.client.post(f"/admin/sagas/run/{self.run.pk}/delete/", {"post": "yes"})
        assert response.status_code == 403
        assert Run.objects.filter(pk=self.run.pk).exists()
