"""Refunds from a run's page (issue 18, item 23), through Django's test client against
localstripe: the ledger's "Refund…" for those with the refund permission, the admin's
confirmation (amounts as Stripe has them now, partial amounts, the ceiling), audited, made
once; a 403 and nothing refunded for everyone else; a clear message for every bad amount.

charlie is an operator (who may refund), vera a viewer, alice the submitter of the runs, rita
a viewer given the refund permission alone (she may refund, not operate).
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import Permission
from django.test import Client, TestCase

from stateguard_web.sagas.models import AuditEvent, Effect, Run
from tests.web.api.world import make_user
from tests.web.payments.world import (
    StripeWorld,
    charge,
    ledger,
    refunded_at_stripe,
    refunds_at_stripe,
)


def seen(page: str) -> str:
    found = re.search(r'name="seen" value="([^"]+)"', page)
    assert found, "the page has no refund form"
    return found[1]


def fact(page: str, name: str) -> str:
    """The text of one of the confirmation's amounts, tags and spaces squeezed out."""
    found = re.search(rf'<dd class="{name}">(.*?)</dd>', page, re.S)
    assert found, f"no {name} on the page"
    return " ".join(re.sub(r"<[^>]+>", "", found[1]).split())


def refund_links(page: str) -> list[str]:
    return re.findall(r'<a class="button refund-link" href="([^"]+)" data-refund=', page)


class RefundWorld(StripeWorld, TestCase):
    status = Run.Status.SUCCEEDED

    def setUp(self) -> None:
        self.alice = make_user("alice", "submitter")
        self.charlie = make_user("charlie", "operator")
        self.vera = make_user("vera", "viewer")
        self.rita = make_user("rita", "viewer")
        self.rita.user_permissions.add(Permission.objects.get(
            content_type__app_label="payments", codename="refund_effect"))
        self.run = Run.objects.create(agent="checkout", status=self.status,
                                      submitted_by=self.alice, input={"amount": 2000})
        self.pi = charge(self.stripe, self.run, 2000)
        self.effect = ledger(self.pi)
        self.page_url = f"/runs/{self.run.code}/"
        self.url = f"/runs/{self.run.code}/effects/{self.effect.pk}/refund"

    def client_for(self, who: str) -> Client:
        client = Client()
        client.force_login(getattr(self, who))
        return client

    def post(self, who: str = "charlie", **data: Any) -> Any:
        """``who`` opens the confirmation and posts it with ``data``."""
        client = self.client_for(who)
        return client.post(self.url, {"seen": seen(client.get(self.url).content.decode()),
                                      **data})


class LedgerActionTests(RefundWorld):
    def test_it_offers_a_refund_of_a_stripe_charge_to_those_who_may_refund(self) -> None:
        mail = Effect.objects.create(run=self.run, step_id="s-mail", node="send_mail",
                                     provider="smtp", kind="mail", external_id="msg-1",
                                     recorded_at=self.effect.recorded_at)
        for who in ("charlie", "rita"):
            page = self.client_for(who).get(self.page_url).content.decode()
            assert refund_links(page) == [self.url], who
            assert f'aria-label="Refund {self.pi}…">Refund…</a>' in page
            assert mail.external_id in page
        for who in ("vera", "alice"):
            page = self.client_for(who).get(self.page_url).content.decode()
            assert self.pi in page and refund_links(page) == [], who
            assert "/effects/" not in page

    def test_it_offers_no_refund_of_a_charge_refunded_in_full(self) -> None:
        client = self.client_for("charlie")
        self.post(reason="all of it")
        page = client.get(self.page_url).content.decode()
        assert ledger(self.pi).status == Effect.Status.COMPENSATED
        assert 'data-effect="refund"' in page and refund_links(page) == []


class ConfirmationTests(RefundWorld):
    def test_it_shows_the_charge_as_stripe_and_the_ledger_have_it_now(self) -> None:
        self.stripe.v1.refunds.create(params={"payment_intent": self.pi, "amount": 300})
        response = self.client_for("charlie").get(self.url)
        page = response.content.decode()

        assert response.status_code == 200
        assert f"Refund <code>{self.pi}</code>?" in page
        assert fact(page, "charged") == "20.00 USD (2000)"
        assert fact(page, "refunded") == "3.00 USD (300)"
        assert fact(page, "ledger-refunded") == "0.00 USD (0)"
        assert fact(page, "remaining") == "17.00 USD (1700)"
        assert re.search(r'<input type="text" name="amount" inputmode="numeric"', page)
        assert "Empty: all that remains, 1700 (17.00 USD)." in page
        assert '<textarea name="reason"' in page and 'name="resolve"' not in page
        assert "data-submit-once" in page and "/static/js/refund.js" in page
        assert f'href="{self.page_url}">Cancel</a>' in page

    def test_it_refunds_a_part_then_the_rest_and_says_so(self) -> None:
        client = self.client_for("charlie")
        token = seen(client.get(self.url).content.decode())
        done = client.post(self.url, {"seen": token, "amount": "500", "reason": "a broken mug"},
                           follow=True)

        (refund,) = refunds_at_stripe(self.stripe, self.pi)
        assert done.redirect_chain == [(self.page_url, 302)]
        page = done.content.decode()
        assert f"Refunded 5.00 USD of {self.pi} (Stripe refund {refund.id})." in page
        assert refunded_at_stripe(self.stripe, self.pi) == 500
        assert ledger(self.pi).status == Effect.Status.PARTIALLY_COMPENSATED
        assert ledger(refund.id).undoes == self.pi and 'data-effect="refund"' in page
        event = AuditEvent.objects.get(run=self.run, action="effect.refunded")
        assert (event.actor, event.data["amount"], event.data["reason"]) == (
            "charlie", 500, "a broken mug")
        assert refund_links(page) == [self.url]  # 15.00 USD remain

        again = client.get(self.url).content.decode()
        assert fact(again, "remaining") == "15.00 USD (1500)"
        assert fact(again, "ledger-refunded") == "5.00 USD (500)"
        rest = client.post(self.url, {"seen": seen(again), "amount": "", "reason": "the rest"})
        assert rest.status_code == 302
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        assert ledger(self.pi).status == Effect.Status.COMPENSATED

        after = client.get(self.url)
        assert "Nothing remains to be refunded." in after.content.decode()
        assert 'name="seen"' not in after.content.decode()
        assert client.post(self.url, {"reason": "more"}).status_code == 409
        assert refunded_at_stripe(self.stripe, self.pi) == 2000

    def test_it_says_what_is_wrong_with_an_amount_and_refunds_nothing(self) -> None:
        at_most = f"At most 2000 (20.00 USD) remains to be refunded of {self.pi}."
        for amount, said in (("0", "The amount must be at least 1."),
                             ("-3", "The amount must be at least 1."),
                             ("2001", at_most),
                             ("9" * 40, at_most),
                             ("12.50", "The amount must be a whole number (cents)."),
                             ("12,50", "The amount must be a whole number (cents)."),
                             ("abc", "The amount must be a whole number (cents)."),
                             ("1e3", "The amount must be a whole number (cents).")):
            response = self.post(amount=amount, reason="too much")
            page = response.content.decode()
            assert response.status_code == 200, amount
            assert f"<li>{said}</li>" in page, amount
            assert 'aria-invalid="true"' in page and f'value="{amount}"' in page, amount
        assert refunds_at_stripe(self.stripe, self.pi) == []
        assert not AuditEvent.objects.exists()
        assert ledger(self.pi).status == Effect.Status.APPLIED

    def test_it_checks_the_reason_and_the_page_it_was_given(self) -> None:
        client = self.client_for("charlie")
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
        client = self.client_for("charlie")
        token = seen(client.get(self.url).content.decode())
        first = client.post(self.url, {"seen": token, "amount": "500", "reason": "r"})
        again = client.post(self.url, {"seen": token, "amount": "500", "reason": "r"})

        assert first.status_code == 302
        assert again.status_code == 409
        text = again.content.decode()
        assert "changed since it was shown" in text and "Nothing was refunded; look again." in text
        assert fact(text, "refunded") == "5.00 USD (500)"  # as Stripe has it now
        assert len(refunds_at_stripe(self.stripe, self.pi)) == 1
        assert Effect.objects.filter(kind="refund").count() == 1

    def test_a_stripe_error_is_shown_and_nothing_is_recorded(self) -> None:
        client = self.client_for("charlie")
        token = seen(client.get(self.url).content.decode())
        with self.proxied() as proxy:
            proxy.faults[("POST", "/v1/refunds")] = "refused"
            response = client.post(self.url, {"seen": token, "amount": "700", "reason": "r"})
        text = response.content.decode()
        assert response.status_code == 409
        assert (f"refund of {self.pi} failed, nothing was refunded: Stripe answered with "
                "an error (HTTP 400): injected: Stripe refused this") in text
        assert 'value="700"' in text and 'name="seen"' in text  # the form again, as it was
        assert refunded_at_stripe(self.stripe, self.pi) == 0
        assert not Effect.objects.filter(kind="refund").exists()
        assert AuditEvent.objects.get(action="effect.refund_failed").actor == "charlie"

    def test_stripe_unreachable_shows_the_page_without_a_form(self) -> None:
        with self.settings(STRIPE_API_BASE="http://127.0.0.1:9"):
            response = self.client_for("charlie").get(self.url)
        text = response.content.decode()
        assert response.status_code == 200
        assert "Stripe cannot be read now, so nothing can be refunded" in text
        assert 'name="seen"' not in text and "Back to the run" in text


class AccessTests(RefundWorld):
    def test_it_refuses_those_without_the_permission_and_refunds_nothing(self) -> None:
        token = seen(self.client_for("charlie").get(self.url).content.decode())
        for who in ("vera", "alice"):
            client = self.client_for(who)
            assert client.get(self.url).status_code == 403, who
            response = client.post(self.url, {"seen": token, "reason": "forged"})
            assert response.status_code == 403, who
            assert "may not refund runs" in response.content.decode()
        anonymous = Client().post(self.url, {"seen": token, "reason": "forged"})
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
        assert refunds_at_stripe(self.stripe, self.pi) == []
        assert not AuditEvent.objects.exists()

    def test_it_answers_404_for_what_is_no_stripe_charge_of_the_run(self) -> None:
        other = Run.objects.create(agent="checkout", status=Run.Status.SUCCEEDED)
        elsewhere = ledger(charge(self.stripe, other, 900))
        mail = Effect.objects.create(run=self.run, step_id="s-mail", node="send_mail",
                                     provider="smtp", kind="charge", external_id="msg-1",
                                     recorded_at=self.effect.recorded_at)
        client = self.client_for("charlie")
        for pk in (elsewhere.pk, mail.pk, 10**9):
            assert client.get(f"/runs/{self.run.code}/effects/{pk}/refund").status_code == 404
        unknown = f"/runs/00000000-0000-4000-8000-000000000000/effects/{self.effect.pk}/refund"
        assert client.get(unknown).status_code == 404
        assert client.put(self.url).status_code == 405
        assert refunded_at_stripe(self.stripe, self.pi) == 0


class NeedsAttentionTests(RefundWorld):
    status = Run.Status.NEEDS_ATTENTION

    def test_an_operator_refunds_and_resolves_the_run_in_one_step(self) -> None:
        client = self.client_for("charlie")
        page = client.get(self.url).content.decode()
        assert 'name="resolve"' in page and "Also resolve the run" in page

        done = client.post(self.url, {"seen": seen(page), "reason": "booking never came",
                                      "resolve": "on"}, follow=True)

        assert "is resolved (compensated by hand)." in done.content.decode()
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.COMPENSATED
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        assert list(AuditEvent.objects.filter(run=self.run).order_by("pk").values_list(
            "action", "actor")) == [("effect.refunded", "charlie"),
                                    ("run.resolved_by_hand", "charlie")]

    def test_one_who_may_refund_but_not_operate_is_not_offered_the_resolve(self) -> None:
        page = self.client_for("rita").get(self.url).content.decode()
        assert 'name="resolve"' not in page

        response = self.post("rita", reason="r", resolve="on")

        assert response.status_code == 302
        assert refunded_at_stripe(self.stripe, self.pi) == 2000
        self.run.refresh_from_db()
        assert self.run.status == Run.Status.NEEDS_ATTENTION
