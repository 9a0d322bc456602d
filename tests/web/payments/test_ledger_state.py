"""What the ledger can vouch for, in the API and the admin as on the run page
(``sagas.ledger``): an effect whose step's undo was tried and recorded no undo of it is in
doubt; one whose undo was skipped (not safe in doubt) or never ran stands as the journal says;
one that undid another says so."""

from __future__ import annotations

import json
import re
from io import StringIO

from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from stateguard_web.sagas.models import Compensation, Effect, Run, Step
from tests.web.api.world import World


class LedgerStateTests(World):
    @classmethod
    def setUpTestData(cls) -> None:
        super().setUpTestData()
        now = timezone.now()
        cls.server = Run.objects.create(agent="provision", status=Run.Status.NEEDS_ATTENTION,
                                     submitted_by=cls.alice, input={"name": "web-9"})
        undo = {"create_group": Compensation.Status.SUCCEEDED,
                "launch_instance": Compensation.Status.FAILED,
                "attach_address": Compensation.Status.SKIPPED_IN_DOUBT,
                "create_record": None}  # never undone: the run did not get that far back
        for seq, (node, status) in enumerate(undo.items(), start=1):
            step = Step.objects.create(run=cls.server, step_id=f"s-{node}", node=node,
                                       status=Step.Status.SUCCEEDED, started_at=now,
                                       finished_at=now, done_seq=seq)
            if status is not None:
                Compensation.objects.create(run=cls.server, step=step, node=node, status=status,
                                            idempotency_key=f"k-{node}")

        def effect(node: str, kind: str, external_id: str, status: str,
                   undoes: str = "") -> None:
            Effect.objects.create(run=cls.server, step_id=f"s-{node}", node=node, provider="ec2",
                                  kind=kind, external_id=external_id, status=status,
                                  undoes=undoes, recorded_at=now)

        effect("create_group", "security_group", "sg-1", "compensated")
        effect("create_group", "deletion", "sg-1 deleted", "compensated", undoes="sg-1")
        effect("launch_instance", "instance", "i-1", "applied")
        effect("attach_address", "elastic_ip", "eipalloc-1", "applied")
        effect("create_record", "dns_record", "web-9.stateguard.test. A", "applied")

    STATES = {"sg-1": "compensated", "sg-1 deleted": "undoes", "i-1": "in_doubt",
              "eipalloc-1": "applied", "web-9.stateguard.test. A": "applied"}

    def test_the_api_gives_each_effect_its_state(self) -> None:
        response = self.call("vera", "GET", f"/api/runs/{self.server.code}")

        assert response.status_code == 200
        assert {e["external_id"]: e["state"]
                for e in response.json()["effects"]} == self.STATES

    def test_manage_py_run_status_gives_each_effect_its_state(self) -> None:
        out = StringIO()
        call_command("run_status", str(self.server.code), stdout=out)
        assert {e["external_id"]: e["state"]
                for e in json.loads(out.getvalue())["effects"]} == self.STATES

    def test_the_ledger_admin_lists_the_state(self) -> None:
        client = Client()
        client.force_login(self.root)

        page = client.get(f"/admin/payments/ledgereffect/?run__code={self.server.code}")

        assert page.status_code == 200
        cells = _cells(page.content.decode(), "field-state")
        assert sorted(cells) == ["applied", "applied", "compensated", "in doubt", "undoes"]
        instance = Effect.objects.get(external_id="i-1")
        detail = client.get(f"/admin/payments/ledgereffect/{instance.pk}/change/")
        assert "in doubt" in _cells(detail.content.decode(), "field-state")[0]

    def test_the_run_admin_shows_the_state_in_its_ledger(self) -> None:
        client = Client()
        client.force_login(self.root)

        page = client.get(f"/admin/sagas/run/{self.server.pk}/change/")

        assert page.status_code == 200
        assert sorted(_cells(page.content.decode(), "field-state")) == [
            "applied", "applied", "compensated", "in doubt", "undoes"]


def _cells(html: str, css: str) -> list[str]:
    """The text of each element with class ``css`` (a column's cells, a field's box)."""
    found = re.findall(rf'class="[^"]*\b{css}\b[^"]*"[^>]*>(.*?)</(?:td|div|p)>', html, re.S)
    return [re.sub(r"<[^>]+>|\s+", " ", cell).strip() for cell in found]
