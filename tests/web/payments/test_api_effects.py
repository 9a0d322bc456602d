"""GET /api/runs/{code} shows the run's effects: the ledger, as the journal keeps it."""

from __future__ import annotations

from django.utils import timezone

from stateguard.effects import Effect as CoreEffect
from stateguard.effects import EffectRecord
from stateguard_web.runs import runtime
from tests.web.api.world import World


class RunDetailEffectsTests(World):
    def test_it_lists_the_effects_with_what_they_undo_and_their_status(self) -> None:
        code = str(self.stuck.code)
        record = runtime.journal().effect_record
        record(EffectRecord(code, "t-charge-2", "charge_user", CoreEffect(
            "stripe", "charge", "pi_1", amount=500, currency="usd", idempotency_key="k")))
        record(EffectRecord(code, "t-charge-2", "charge_user", CoreEffect(
            "stripe", "refund", "re_1", amount=200, currency="usd", undoes="pi_1")))

        response = self.call("vera", "GET", f"/api/runs/{code}")

        assert response.status_code == 200
        effects = response.json()["effects"]
        # The step's compensation failed: the ledger cannot vouch for the rest of the charge.
        assert [{k: v for k, v in e.items() if k != "recorded_at"} for e in effects] == [
            {"provider": "stripe", "kind": "charge", "external_id": "pi_1", "amount": 500,
             "currency": "usd", "status": "partially_compensated", "state": "in_doubt",
             "undoes": None, "node": "charge_user", "step_id": "t-charge-2"},
            {"provider": "stripe", "kind": "refund", "external_id": "re_1", "amount": 200,
             "currency": "usd", "status": "compensated", "state": "undoes", "undoes": "pi_1",
             "node": "charge_user", "step_id": "t-charge-2"}]
        assert all(e["recorded_at"] <= timezone.now().isoformat() for e in effects)

    def test_a_run_without_effects_has_an_empty_list(self) -> None:
        response = self.call("charlie", "GET", f"/api/runs/{self.failed.code}")
        assert response.status_code == 200 and response.json()["effects"] == []

    def test_the_schema_documents_them(self) -> None:
        schema = self.call("root", "GET", "/api/openapi.json").json()
        effect = schema["components"]["schemas"]["EffectOut"]
        assert set(effect["required"]) >= {"kind", "external_id", "amount", "currency",
                                           "status", "state", "undoes", "step_id"}
        assert effect["properties"]["state"]["enum"] == [
            "applied", "partially_compensated", "compensated", "undoes", "in_doubt"]
        assert "effects" in schema["components"]["schemas"]["RunDetailOut"]["required"]
