"""Refunds from the admin, as issue 10 accepts them: the confirmation page says what was
charged, what is refunded and the most that can be; two submissions at once make one refund;
above what remains is refused; a partial refund leaves the rest refundable; a user without the
permission sees no action and gets a 403. The journal stays read-only."""

from __future__ import annotations

import re

from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client, TestCase, TransactionTestCase

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
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


def client_of(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def seen(page: str) -> str:
    found = re.search(r'name="seen" value="([^"]+)"', page)
    assert found, "the page has no refund form"
    return found[1]


def row(page: str, external_id: str) -> str:
    found = re.search(rf'<tr class="charge" data-charge="{external_id}">(.*?)</tr>', page, re.S)
    assert found, f"no row for {external_id}"
    return re.sub(r"\s+", " ", found[1])


class RefundAdminTests(StripeWorld, TestCase):
    def setUp(self) -> None:
        self.who = people()
        self.run = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        self.pi = charge(self.stripe, self.run, 2000)
        self.effect = ledger(self.pi)
        self.url = f"/admin/payments/ledgereffect/{self.effect.pk}/refund/"

    def post(self, who: str, url: str | None = None, **data: object) -> object:
        client = client_of(self.who[who])
        page = client.get(url or self.url).content.decode()
        return client.post(url or self.url, {"seen": seen(page), **data})

    def test_the_page_shows_charged_refunded_and_the_most_that_can_be_refunded(self) -> None:
        self.stripe.v1.refunds.create(params={"payment_intent": self.pi, "amount": 300})
        response = client_of(self.who["bob"]).get(self.url)
        page = response.content.decode()

        assert response.status_code == 200
        cells = row(page, self.pi)
        assert "<td class=\"charged\">2000 (20.00 USD)</td>" in cells
        assert "<td class=\"refunded\">300 (3.00 USD)</td>" in cells
        assert "<td class=\"ledger-refunded\">0 (0.00 USD)</td>" in cells
        assert "<td class=\"remaining\">1700 (17.00 USD)</td>" in cells
        # A text input: a number input sends "abc" as an empty amount, i.e. all that remains.
        assert '<input type="text" name="amount" inputmode="numeric"' in page
        assert '<textarea name="reason"' in page and "required" in page
        assert "Empty: all that remains, 1700 (17.00 USD)." in page
        assert 'name="resolve"' not in page  # the run does not need attention
        assert str(self.run.code) in page

    def test_the_action_leads_to_the_page_and_the_page_refunds(self) -> None:
        client = client_of(self.who["bob"])
        listing = client.get("/admin/payments/ledgereffect/").content.decode()
        assert '<option value="refund">' in listing and self.pi in listing
        response = client.post("/admin/payments/ledgereffect/", {
            "action": "refund", "_selected_action": [self.effect.pk]})
        assert (response.status_code, response["Location"]) == (302, self.url)

        page = client.get(self.url).content.decode()
        done = client.post(self.url, {"seen": seen(page), "reason": "customer asked"},
                           follow=True)

        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        (refund,) = refunds_at_stripe(self.stripe, self.pi)
        assert done.redirect_chain[0][0] == f"/admin/payments/ledgereffect/{self.effect.pk}/change/"
        assert f"Refunded 20.00 USD of {self.pi} (Stripe refund {refund.id})." in \
            done.content.decode()
        assert ledger(self.pi).status == Effect.Status.COMPENSATED
        assert AuditEvent.objects.get(action="effect.refunded").actor == "bob"

    def test_a_partial_refund_leaves_the_rest_refundable(self) -> None:
        response = self.post("bob", amount="500", reason="half a mug")
        assert response.status_code == 302  # type: ignore[attr-defined]
        assert refunded_at_stripe(self.stripe, self.pi) == 500
        assert ledger(self.pi).status == Effect.Status.PARTIALLY_COMPENSATED

        page = client_of(self.who["bob"]).get(self.url).content.decode()
        assert "<td class=\"remaining\">1500 (15.00 USD)</td>" in row(page, self.pi)
        assert "<td class=\"ledger-refunded\">500 (5.00 USD)</td>" in row(page, self.pi)
        assert self.post("bob", reason="the rest").status_code == 302  # type: ignore[attr-defined]
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        assert ledger(self.pi).status == Effect.Status.COMPENSATED

        after = client_of(self.who["bob"]).get(self.url).content.decode()
        assert "<td class=\"remaining\">0 (0.00 USD)</td>" in row(after, self.pi)
        assert 'name="seen"' not in after  # no form: nothing to refund

    def test_above_the_remaining_amount_is_refused(self) -> None:
        for amount, said in (("2001", "At most 2000 (20.00 USD) remains to be refunded of "
                                      f"{self.pi}."),
                             ("0", "The amount must be at least 1."),
                             ("-3", "The amount must be at least 1."),
                             ("12.50", "The amount must be a whole number (cents)."),
                             ("1e3", "The amount must be a whole number (cents)."),
                             ("9" * 40, "At most 2000")):
            response = self.post("bob", amount=amount, reason="too much")
            assert response.status_code == 200, amount  # type: ignore[attr-defined]
            assert said in response.content.decode(), amount  # type: ignore[attr-defined]
        assert refunds_at_stripe(self.stripe, self.pi) == []
        assert not AuditEvent.objects.exists()

    def test_every_input_is_checked(self) -> None:
        client = client_of(self.who["bob"])
        token = seen(client.get(self.url).content.decode())
        for data, said in (({"seen": token, "reason": "   "}, "This field is required."),
                           ({"seen": token, "reason": "a\x00b"}, "Null characters are not "
                                                                   "allowed."),
                           ({"seen": token, "reason": "x" * 501}, "at most 500 characters"),
                           ({"seen": token + "x", "reason": "r"}, "out of date or was altered"),
                           ({"reason": "r"}, "This field is required.")):
            response = client.post(self.url, data)
            assert response.status_code == 200 and said in response.content.decode(), said
        assert refunds_at_stripe(self.stripe, self.pi) == []

    def test_a_double_submit_refunds_once(self) -> None:
        client = client_of(self.who["bob"])
        token = seen(client.get(self.url).content.decode())
        first = client.post(self.url, {"seen": token, "amount": "500", "reason": "r"})
        again = client.post(self.url, {"seen": token, "amount": "500", "reason": "r"})

        assert first.status_code == 302
        assert again.status_code == 409
        assert "changed since it was shown" in again.content.decode()
        assert "Nothing was refunded; look again." in again.content.decode()
        assert refunded_at_stripe(self.stripe, self.pi) == 500

    def test_a_user_without_the_permission_sees_no_action_and_gets_403(self) -> None:
        charlie = client_of(self.who["charlie"])  # staff, may read every run
        listing = charlie.get("/admin/payments/ledgereffect/")
        assert listing.status_code == 200 and self.pi in listing.content.decode()
        assert 'value="refund"' not in listing.content.decode()
        assert 'value="verify_with_stripe"' not in listing.content.decode()
        runs = charlie.get("/admin/sagas/run/").content.decode()
        assert 'value="refund_run"' not in runs
        detail = charlie.get(f"/admin/payments/ledgereffect/{self.effect.pk}/change/")
        assert detail.status_code == 200 and "refund-link" not in detail.content.decode()

        assert charlie.get(self.url).status_code == 403
        assert charlie.post(self.url, {"reason": "r"}).status_code == 403
        run_url = f"/admin/sagas/run/{self.run.pk}/refund/"
        assert charlie.get(run_url).status_code == 403
        response = charlie.post("/admin/payments/ledgereffect/", {
            "action": "refund", "_selected_action": [self.effect.pk]})
        assert response.status_code == 200  # "no action selected"
        assert refunds_at_stripe(self.stripe, self.pi) == []

    def test_operators_and_superusers_have_the_permission(self) -> None:
        assert self.who["bob"].has_perm("payments.refund_effect")
        assert self.who["alice"].has_perm("payments.refund_effect")
        assert not self.who["charlie"].has_perm("payments.refund_effect")
        assert [access.may(self.who[name], Ability.REFUND) for name in ("alice", "bob",
                                                                         "charlie")] == [
            True, True, False]
        operators = Group.objects.get(name="operator")
        assert operators.permissions.filter(content_type__app_label="payments",
                                            codename="refund_effect").exists()

    def test_the_journal_and_the_ledger_stay_read_only(self) -> None:
        alice = client_of(self.who["alice"])
        change = f"/admin/payments/ledgereffect/{self.effect.pk}/change/"
        assert alice.post(change, {"amount": "1"}).status_code == 403
        assert alice.get("/admin/payments/ledgereffect/add/").status_code == 403
        delete = f"/admin/payments/ledgereffect/{self.effect.pk}/delete/"
        assert alice.post(delete, {"post": "yes"}).status_code == 403
        assert ledger(self.pi).amount == 2000

    def test_an_unknown_or_non_charge_object_is_a_404(self) -> None:
        alice = client_of(self.who["alice"])
        refund = Effect.objects.create(run=self.run, step_id="s", node="n", provider="stripe",
                                       kind="refund", external_id="re_x", amount=1,
                                       undoes=self.pi, recorded_at=self.effect.recorded_at)
        for pk in (refund.pk, 10**9, "abc"):
            assert alice.get(f"/admin/payments/ledgereffect/{pk}/refund/").status_code == 404
        assert alice.get("/admin/sagas/run/10000000/refund/").status_code == 404


class RunRefundAdminTests(StripeWorld, TestCase):
    def setUp(self) -> None:
        self.who = people()
        self.run = Run.objects.create(agent="checkout", status=Run.Status.NEEDS_ATTENTION)
        self.first = charge(self.stripe, self.run, 2000)
        self.second = charge(self.stripe, self.run, 700)
        self.url = f"/admin/sagas/run/{self.run.pk}/refund/"

    def test_a_run_is_refunded_whole_and_resolved_in_the_same_step(self) -> None:
        client = client_of(self.who["bob"])
        runs = client.get("/admin/sagas/run/").content.decode()
        assert '<option value="refund_run">' in runs
        response = client.post("/admin/sagas/run/", {"action": "refund_run",
                                                      "_selected_action": [self.run.pk]})
        assert response["Location"] == self.url
        page = client.get(self.url).content.decode()
        assert "<td class=\"remaining\">2000 (20.00 USD)</td>" in row(page, self.first)
        assert "<td class=\"remaining\">700 (7.00 USD)</td>" in row(page, self.second)
        assert 'name="amount"' not in page  # what remains of each: no part of several
        assert "Refunds what remains of each charge: 27.00 USD in all." in page
        assert 'name="resolve"' in page and "Also resolve the run" in page

        done = client.post(self.url, {"seen": seen(page), "reason": "booking never came back",
                                      "resolve": "on"}, follow=True)

        text = done.content.decode()
        assert f"Refunded 20.00 USD of {self.first}" in text
        assert f"Refunded 7.00 USD of {self.second}" in text
        assert "is resolved (compensated by hand)" in text
        assert refunded_at_stripe(self.stripe, self.first) == 2000
        assert refunded_at_stripe(self.stripe, self.second) == 700
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        assert list(AuditEvent.objects.filter(run=self.run).order_by("pk").values_list(
            "action", flat=True)) == ["effect.refunded", "effect.refunded",
                                      "run.resolved_by_hand"]

    def test_the_run_page_shows_its_effects_and_a_refund_link(self) -> None:
        page = client_of(self.who["bob"]).get(f"/admin/sagas/run/{self.run.pk}/change/")
        text = page.content.decode()
        assert page.status_code == 200
        assert self.first in text and self.second in text and "Effects (the ledger)" in text
        assert f'href="{self.url}" class="refund-link"' in text
        assert f"?run__code={self.run.code}" in text
        ledger_page = client_of(self.who["bob"]).get(
            f"/admin/payments/ledgereffect/?run__code={self.run.code}")
        assert ledger_page.status_code == 200 and self.second in ledger_page.content.decode()

    def test_without_the_tick_the_run_still_needs_attention(self) -> None:
        client = client_of(self.who["bob"])
        page = client.get(self.url).content.decode()
        client.post(self.url, {"seen": seen(page), "reason": "r"})
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION
        assert refunded_at_stripe(self.stripe, self.second) == 700

    def test_a_stripe_error_is_shown_and_nothing_is_recorded(self) -> None:
        client = client_of(self.who["bob"])
        page = client.get(self.url).content.decode()
        with self.proxied() as proxy:
            proxy.faults[("POST", "/v1/refunds")] = "refused"
            response = client.post(self.url, {"seen": seen(page), "reason": "r",
                                              "resolve": "on"})
        text = response.content.decode()
        assert response.status_code == 409
        assert (f"refund of {self.first} failed, nothing was refunded: Stripe answered with "
                "an error (HTTP 400): injected: Stripe refused this") in text
        assert 'name="seen"' in text  # the form again, with what Stripe shows now
        assert refunded_at_stripe(self.stripe, self.first) == 0
        assert not Effect.objects.filter(kind="refund").exists()
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION

    def test_stripe_unreachable_shows_a_page_without_a_form(self) -> None:
        with self.settings(STRIPE_API_BASE="http://127.0.0.1:9"):
            response = client_of(self.who["bob"]).get(self.url)
        text = response.content.decode()
        assert response.status_code == 200
        assert "Stripe cannot be read now, so nothing can be refunded" in text
        assert 'name="seen"' not in text

    def test_verify_with_stripe_reports_drift(self) -> None:
        self.stripe.v1.refunds.create(params={"payment_intent": self.second, "amount": 200})
        response = client_of(self.who["bob"]).post(
            "/admin/sagas/run/", {"action": "verify_with_stripe",
                                  "_selected_action": [self.run.pk]}, follow=True)
        text = response.content.decode()
        assert f"DRIFT {self.second} (run {self.run.code}): refunded 2.00 USD at Stripe, " \
               "0.00 USD in the ledger" in text
        assert "2 charge(s) compared with Stripe: 2 drift(s)" in text
        assert "reconcile_effects --fix" in text
        assert not Effect.objects.filter(kind="refund").exists()  # it only reports


class RefundAdminAtOnceTests(StripeWorld, TransactionTestCase):
    def test_two_admins_submitting_at_once_make_one_refund(self) -> None:
        who = people()
        run = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        pi = charge(self.stripe, run, 2000)
        url = f"/admin/payments/ledgereffect/{ledger(pi).pk}/refund/"
        alice, bob = client_of(who["alice"]), client_of(who["bob"])
        pages = [c.get(url).content.decode() for c in (alice, bob)]

        with both_read_before_either_refunds():
            answers = at_once(*(lambda c=c, p=p: c.post(url, {"seen": seen(p), "reason": "r"})
                                for c, p in zip((alice, bob), pages, strict=True)))

        assert sorted(a.status_code for a in answers) == [302, 409], answers
        assert refunded_at_stripe(self.stripe, pi) == 2000
        assert len(refunds_at_stripe(self.stripe, pi)) == 1
        assert Effect.objects.filter(kind="refund").count() == 1

    def test_the_migration_gives_operators_the_refund_permission(self) -> None:
        try:
            call_command("migrate", "payments", "0001", verbosity=0)
            operators, _ = Group.objects.get_or_create(name="operator")
            perms = operators.permissions.filter(content_type__app_label="payments",
                                                 codename="refund_effect")
            assert not perms.exists()
            call_command("migrate", "payments", verbosity=0)
            assert perms.exists()
        finally:
            call_command("migrate", verbosity=0)
