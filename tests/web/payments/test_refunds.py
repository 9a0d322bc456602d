"""Refunds by hand (payments.services) against localstripe: made once, never above what
remains, recorded in the ledger and the audit trail, nothing recorded when Stripe fails, and the
run resolved in the same step when asked."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from stateguard_web.payments import services
from stateguard_web.payments.services import RefundError
from stateguard_web.payments.stripe_client import charge_id_of
from stateguard_web.sagas.models import AuditEvent, Effect, Run
from tests.web.payments.world import (
    StripeWorld,
    at_once,
    both_read_before_either_refunds,
    charge,
    ledger,
    people,
    refunded_at_stripe,
    refunds_at_stripe,
)


class ChargedRun(StripeWorld, TestCase):
    """A run (in ``status``) that charged 20.00 USD; ``refund()`` is bob's refund of it."""

    status = Run.Status.SUCCEEDED

    def setUp(self) -> None:
        self.who = people()
        self.run = Run.objects.create(agent="checkout", status=self.status)
        self.pi = charge(self.stripe, self.run, 2000)

    def refund(self, **kwargs: object) -> services.Refund:
        return services.effect_refund(**{"effect": ledger(self.pi), "reason": "customer asked",
                                         "by": self.who["bob"], **kwargs})  # type: ignore[arg-type]


class RefundTests(ChargedRun):

    def test_it_refunds_what_remains_once_and_records_it(self) -> None:
        done = self.refund()

        assert (done.amount, done.currency) == (2000, "usd")
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        (at_stripe,) = refunds_at_stripe(self.stripe, self.pi)
        assert at_stripe.id == done.refund_id
        assert at_stripe.metadata.to_dict() == {
            "stateguard_run": str(self.run.code), "stateguard_by": "bob",
            "stateguard_reason": "customer asked", "stateguard_effect": self.pi}
        refund = ledger(done.refund_id)
        assert (refund.kind, refund.amount, refund.undoes, refund.run_id) == (
            "refund", 2000, self.pi, self.run.pk)
        assert refund.idempotency_key.startswith("stateguard:manual-refund:ch_")
        assert ledger(self.pi).status == Effect.Status.COMPENSATED
        event = AuditEvent.objects.get(run=self.run, action="effect.refunded")
        assert event.actor == "bob"
        assert (event.data["charge"], event.data["refund"], event.data["amount"],
                event.data["reason"]) == (self.pi, done.refund_id, 2000, "customer asked")

    def test_a_partial_refund_leaves_the_rest_refundable(self) -> None:
        self.refund(amount=500)
        assert refunded_at_stripe(self.stripe, self.pi) == 500
        assert ledger(self.pi).status == Effect.Status.PARTIALLY_COMPENSATED

        with pytest.raises(RefundError, match=r"at most 15\.00 USD \(1500\)"):
            self.refund(amount=1501)
        rest = self.refund()

        assert rest.amount == 1500
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        assert ledger(self.pi).status == Effect.Status.COMPENSATED
        with pytest.raises(RefundError, match="nothing remains to be refunded"):
            self.refund()
        assert refunded_at_stripe(self.stripe, self.pi) == 2000  # localstripe would take it

    def test_it_refuses_more_than_remains_and_changes_nothing(self) -> None:
        for amount in (2001, 10**12):
            with pytest.raises(RefundError, match=r"more than remains .* at most 20\.00 USD"):
                self.refund(amount=amount)
        for amount in (0, -5):
            with pytest.raises(RefundError, match="positive whole number"):
                self.refund(amount=amount)
        assert refunds_at_stripe(self.stripe, self.pi) == []
        assert not Effect.objects.filter(kind="refund").exists()
        assert not AuditEvent.objects.filter(action__startswith="effect.").exists()

    def test_never_more_than_the_ledger_recorded(self) -> None:
        other = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        pi = charge(self.stripe, other, 2000, ledger_amount=1500)
        effect = ledger(pi)
        with pytest.raises(RefundError, match=r"at most 15\.00 USD"):
            services.effect_refund(effect=effect, amount=1600, reason="r", by=self.who["bob"])
        assert services.effect_refund(effect=effect, reason="r", by=self.who["bob"]).amount \
            == 1500

    def test_a_refund_made_elsewhere_counts(self) -> None:
        intent = self.stripe.v1.payment_intents.retrieve(self.pi)  # refunded in Stripe's UI
        self.stripe.v1.refunds.create(params={"charge": charge_id_of(intent), "amount": 1200})
        assert self.refund().amount == 800
        assert refunded_at_stripe(self.stripe, self.pi) == 2000

    def test_what_the_operator_saw_must_still_hold(self) -> None:
        """A double submit of a partial refund: the same page, posted twice, refunds once."""
        self.refund(amount=500, seen_refunded=0)
        with pytest.raises(RefundError, match=r"changed since it was shown: Stripe now says "
                                              r"5\.00 USD is refunded, not 0\.00 USD"):
            self.refund(amount=500, seen_refunded=0)
        assert refunded_at_stripe(self.stripe, self.pi) == 500
        assert Effect.objects.filter(kind="refund").count() == 1

    def test_a_reason_is_required_and_checked(self) -> None:
        for reason, why in (("  ", "reason is required"), ("a\x00b", "NUL"),
                            ("x" * 501, "longer than 500")):
            with pytest.raises(RefundError, match=why):
                self.refund(reason=reason)
        assert refunds_at_stripe(self.stripe, self.pi) == []

    def test_only_a_charge_is_refunded(self) -> None:
        done = self.refund(amount=100)
        with pytest.raises(RefundError, match="not a Stripe charge"):
            services.effect_refund(effect=ledger(done.refund_id), reason="r", by="alice")

    def test_it_refuses_while_a_worker_holds_the_run(self) -> None:
        Run.objects.filter(pk=self.run.pk).update(
            lease_owner="worker-1", lease_expires_at=timezone.now() + timedelta(seconds=30))
        with pytest.raises(RefundError, match="being worked on right now"):
            self.refund()
        assert refunds_at_stripe(self.stripe, self.pi) == []
        Run.objects.filter(pk=self.run.pk).update(  # an expired lease: its worker is gone
            lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert self.refund().amount == 2000


class StripeFailureTests(ChargedRun):
    status = Run.Status.NEEDS_ATTENTION

    def test_a_stripe_error_is_a_message_and_nothing_is_recorded(self) -> None:
        for fault, said in (("refused", r"Stripe answered with an error \(HTTP 400\): "
                                        "injected: Stripe refused this"),
                            ("down", r"\(HTTP 500\)")):
            with self.proxied() as proxy:
                proxy.faults[("POST", "/v1/refunds")] = fault
                with pytest.raises(RefundError, match=f"failed, nothing was refunded: "
                                                      f".*{said}"):
                    self.refund(resolve=True)
                assert proxy.seen.count(("POST", "/v1/refunds")) == 1  # no SDK resend
        assert refunded_at_stripe(self.stripe, self.pi) == 0
        assert not Effect.objects.filter(kind="refund").exists()
        assert ledger(self.pi).status == Effect.Status.APPLIED
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION  # not resolved either
        actions = list(AuditEvent.objects.filter(run=self.run).values_list("action", flat=True))
        assert actions == ["effect.refund_failed", "effect.refund_failed"]

    def test_a_lost_answer_is_not_refunded_again(self) -> None:
        with self.proxied() as proxy:
            proxy.faults[("POST", "/v1/refunds")] = "lost"
            with pytest.raises(RefundError, match=r"could not be reached, or its answer was "
                                                  r"lost .*, so the refund may or may not have "
                                                  r"been made; nothing was recorded"):
                self.refund(seen_refunded=0)
            assert proxy.seen.count(("POST", "/v1/refunds")) == 1
        assert refunded_at_stripe(self.stripe, self.pi) == 2000  # it was made, though
        assert not Effect.objects.filter(kind="refund").exists()
        with pytest.raises(RefundError, match="changed since it was shown"):
            self.refund(seen_refunded=0)  # the page the operator still has open
        with pytest.raises(RefundError, match="nothing remains"):
            self.refund()
        assert refunded_at_stripe(self.stripe, self.pi) == 2000

    def test_stripe_unreachable_before_refunding_is_a_message(self) -> None:
        with self.settings(STRIPE_API_BASE="http://127.0.0.1:9"), \
                pytest.raises(RefundError, match="could not be reached"):
            self.refund()
        assert not AuditEvent.objects.exists()  # nothing was tried at Stripe


class ResolveTests(ChargedRun):
    status = Run.Status.NEEDS_ATTENTION

    def test_it_resolves_the_run_in_the_same_step(self) -> None:
        done = services.effect_refund(effect=ledger(self.pi), reason="refund failed twice",
                                      by=self.who["bob"], resolve=True)

        assert done.resolved and not done.resolve_refused
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        events = list(AuditEvent.objects.filter(run=self.run).order_by("pk"))
        assert [(e.actor, e.action) for e in events] == [
            ("bob", "effect.refunded"), ("bob", "run.resolved_by_hand")]
        assert events[1].data["note"] == (f"refunded 20.00 USD of {self.pi} (Stripe refund "
                                          f"{done.refund_id}) by hand: refund failed twice")

    def test_without_the_tick_the_run_still_needs_attention(self) -> None:
        services.effect_refund(effect=ledger(self.pi), reason="r", by=self.who["bob"])
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION

    def test_a_run_that_cannot_be_resolved_is_refused_before_any_refund(self) -> None:
        Run.objects.filter(pk=self.run.pk).update(status=Run.Status.SUCCEEDED)
        with pytest.raises(RefundError, match=r"cannot resolve: run .* is succeeded"):
            services.effect_refund(effect=ledger(self.pi), reason="r", by=self.who["bob"],
                                   resolve=True)
        assert refunded_at_stripe(self.stripe, self.pi) == 0

    def test_a_run_with_two_charges_is_refunded_whole_and_then_resolved(self) -> None:
        second = charge(self.stripe, self.run, 700)
        services.effect_refund(effect=ledger(self.pi), amount=300, reason="r", by="bob")

        done = services.run_refund(run=self.run, reason="all of it", by=self.who["bob"],
                                   resolve=True)

        assert [(d.charge.external_id, d.amount) for d in done] == [(self.pi, 1700),
                                                                    (second, 700)]
        assert [d.resolved for d in done] == [False, True]
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        assert refunded_at_stripe(self.stripe, second) == 700
        assert {ledger(self.pi).status, ledger(second).status} == {Effect.Status.COMPENSATED}
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        with pytest.raises(RefundError, match="nothing remains to be refunded of run"):
            services.run_refund(run=self.run, reason="again", by=self.who["bob"])

    def test_a_run_refund_says_what_was_done_when_a_later_charge_fails(self) -> None:
        second = charge(self.stripe, self.run, 700)
        calls = []

        def second_fails(**kwargs: object) -> services.Refund:
            calls.append(kwargs["effect"])
            if len(calls) == 2:
                raise RefundError("Stripe said no")
            return real(**kwargs)  # type: ignore[arg-type]

        real = services.effect_refund
        with mock.patch.object(services, "effect_refund", second_fails), \
                pytest.raises(RefundError, match=rf"refunded 20\.00 USD of {self.pi} .*; "
                                                 r"then Stripe said no \(nothing more"):
            services.run_refund(run=self.run, reason="r", by="bob", resolve=True)
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        assert refunded_at_stripe(self.stripe, second) == 0
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION


class RefundsAtOnceTests(StripeWorld, TransactionTestCase):
    """Real concurrency: two threads, two database connections, one localstripe."""

    def test_two_refunds_at_once_make_one(self) -> None:
        who = people()
        run = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        pi = charge(self.stripe, run, 2000)

        def refund(by: str) -> object:
            return services.effect_refund(effect=ledger(pi), reason="at once", by=who[by])

        with both_read_before_either_refunds():
            results = at_once(lambda: refund("alice"), lambda: refund("bob"))

        made = [r for r in results if isinstance(r, services.Refund)]
        refused = [r for r in results if isinstance(r, RefundError)]
        assert (len(made), len(refused)) == (1, 1), results
        assert "nothing remains to be refunded" in str(refused[0])
        assert refunded_at_stripe(self.stripe, pi) == 2000  # not 4000
        assert len(refunds_at_stripe(self.stripe, pi)) == 1
        assert Effect.objects.filter(kind="refund").count() == 1
        assert AuditEvent.objects.filter(action="effect.refunded").count() == 1
