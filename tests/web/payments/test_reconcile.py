"""manage.py reconcile_effects: the ledger compared with localstripe, drift reported one line
each, and with --fix, what Stripe shows recorded (once)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import TestCase

from stateguard_web.payments.reconcile_stripe import ledger_reconcile
from stateguard_web.sagas.models import AuditEvent, Effect, Run
from tests.web.payments.world import StripeWorld, charge, ledger, people, refunded_at_stripe


def reconcile(*args: str, provider: str = "stripe") -> tuple[int, list[str]]:
    """Run the command in this process (with Stripe alone, by default); its exit status and
    its lines."""
    out = io.StringIO()
    try:
        call_command("reconcile_effects", "--provider", provider, *args, stdout=out)
        status = 0
    except CommandError as exc:
        status = exc.returncode
        out.write(f"{exc}\n")
    return status, out.getvalue().splitlines()


class ReconcileTests(StripeWorld, TestCase):
    def setUp(self) -> None:
        self.who = people()
        self.run = Run.objects.create(agent="checkout", status=Run.Status.COMPENSATED)

    def test_a_ledger_that_matches_stripe_has_no_drift(self) -> None:
        pi = charge(self.stripe, self.run, 2000)
        status, lines = reconcile()
        assert (status, lines) == (0, ["1 charge(s) compared with Stripe: 0 drift(s)"])
        assert ledger(pi).status == Effect.Status.APPLIED

    def test_it_reports_a_charge_the_ledger_lacks_and_fix_records_it(self) -> None:
        """The worker died between Stripe's answer and recording the charge."""
        pi = charge(self.stripe, self.run, 2000, record=False)
        self.stripe.v1.refunds.create(params={"payment_intent": pi, "amount": 2000})

        status, lines = reconcile()
        assert status == 1
        assert lines[0].startswith(f"DRIFT {pi} (run {self.run.code}): charged 20.00 USD at "
                                   "Stripe (ch_")
        assert lines[0].endswith("), not in the ledger")
        assert lines[-1] == "1 drift(s) remain (--fix records what the providers show)"
        assert not Effect.objects.exists()

        status, lines = reconcile("--fix", "--by", "bob")
        assert status == 0, lines
        assert lines[0].startswith(f"FIXED {pi} (run {self.run.code}): charged 20.00 USD")
        assert lines[0].endswith("not in the ledger: recorded")
        assert lines[1].startswith(f"FIXED {pi} (run {self.run.code}): refund re_")
        assert lines[1].endswith("of 20.00 USD is at Stripe, not in the ledger: recorded")
        recorded = ledger(pi)
        assert (recorded.run_id, recorded.kind, recorded.amount, recorded.currency,
                recorded.node, recorded.status) == (self.run.pk, "charge", 2000, "usd",
                                                    "charge_user", Effect.Status.COMPENSATED)
        assert Effect.objects.get(kind="refund").undoes == pi
        events = AuditEvent.objects.filter(action="effect.reconciled").order_by("pk")
        assert [(e.actor, e.data["kind"]) for e in events] == [("bob", "charge"),
                                                                ("bob", "refund")]
        assert all(str(e.data["via"]).startswith("cli") for e in events)  # --by, from a shell

        assert reconcile() == (0, ["1 charge(s) compared with Stripe: 0 drift(s)"])
        assert reconcile("--fix")[0] == 0
        assert Effect.objects.count() == 2  # recorded once

    def test_it_reports_refunded_amounts_that_differ_and_fix_records_the_refunds(self) -> None:
        pi = charge(self.stripe, self.run, 2000)
        for amount in (300, 200):  # made in Stripe's dashboard, say
            self.stripe.v1.refunds.create(params={"payment_intent": pi, "amount": amount})

        status, lines = reconcile()
        assert status == 1
        assert f"DRIFT {pi} (run {self.run.code}): refunded 5.00 USD at Stripe, 0.00 USD in " \
               "the ledger" in lines
        assert sum(line.startswith(f"DRIFT {pi} (run {self.run.code}): refund re_")
                   and line.endswith("is at Stripe, not in the ledger") for line in lines) == 2
        assert lines[3] == "1 charge(s) compared with Stripe: 3 drift(s)"

        status, lines = reconcile("--fix")
        assert status == 0
        assert [line.split(":")[0].split()[0] for line in lines[:2]] == ["FIXED", "FIXED"]
        assert ledger(pi).status == Effect.Status.PARTIALLY_COMPENSATED
        assert sorted(Effect.objects.filter(kind="refund").values_list("amount", flat=True)) \
            == [200, 300]

    def test_what_it_cannot_fix_stays_drift(self) -> None:
        gone = Run.objects.create(agent="checkout")
        orphan = charge(self.stripe, gone, 900, record=False)
        Run.objects.filter(pk=gone.pk).delete()  # its run is not in the journal any more
        odd = charge(self.stripe, self.run, 2000, ledger_amount=1500)
        Effect.objects.create(run=self.run, step_id="s", node="charge_user", provider="stripe",
                              kind="charge", external_id="pi_nowhere", amount=100,
                              recorded_at=ledger(odd).recorded_at)

        status, lines = reconcile("--fix")

        assert status == 1
        assert any(line.startswith(f"DRIFT {orphan} (run {gone.code}): charged 9.00 USD")
                   and line.endswith("its run is not in the journal, so it is not recorded")
                   for line in lines), lines
        assert f"DRIFT {odd} (run {self.run.code}): charged 20.00 USD at Stripe, 15.00 USD in " \
               "the ledger" in lines
        assert any(line.startswith(f"DRIFT pi_nowhere (run {self.run.code}): in the ledger, but "
                                   "pi_nowhere: Stripe answered with an error (HTTP 404)")
                   for line in lines), lines
        assert lines[-1] == "3 drift(s) remain"
        assert not Effect.objects.filter(external_id=orphan).exists()

    def test_since_lists_only_what_was_made_from_then_on(self) -> None:
        pi = charge(self.stripe, self.run, 2000, record=False)
        later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
        assert reconcile("--since", later) == (
            0, ["0 charge(s) compared with Stripe: 0 drift(s)"])
        earlier = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
        status, lines = reconcile("--since", earlier)
        assert status == 1 and lines[0].startswith(f"DRIFT {pi}")
        with pytest.raises(CommandError, match="not an ISO 8601 date"):
            call_command("reconcile_effects", "--since", "yesterday")

    def test_stripe_unreachable_is_an_error_not_a_report(self) -> None:
        charge(self.stripe, self.run, 2000)
        with self.settings(STRIPE_API_BASE="http://127.0.0.1:9"):
            status, lines = reconcile()
        assert status == 1
        assert lines == ["could not read Stripe: Stripe could not be reached, or its answer "
                         "was lost (a network error)", "not compared: stripe"]

    def test_a_lost_refund_answer_is_found_and_recorded(self) -> None:
        """A refund made by hand whose answer was lost: recorded by reconcile, not refunded
        again, and the charge's status settled."""
        from stateguard_web.payments import services

        pi = charge(self.stripe, self.run, 2000)
        with self.proxied() as proxy:
            proxy.faults[("POST", "/v1/refunds")] = "lost"
            with pytest.raises(services.RefundError):
                services.effect_refund(effect=ledger(pi), reason="r", by=self.who["bob"])
        report = ledger_reconcile(runs=[self.run], fix=True, by=self.who["alice"])
        assert [d.fixed for d in report.drift] == [True]
        refund = Effect.objects.get(kind="refund")
        assert (refund.amount, refund.undoes) == (2000, pi)
        assert ledger(pi).status == Effect.Status.COMPENSATED
        assert refunded_at_stripe(self.stripe, pi) == 2000
