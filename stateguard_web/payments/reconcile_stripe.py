"""Reconciliation with Stripe (``drift.Reconciler``): the ledger compared with what Stripe
shows, and with ``fix``, brought in line.

Looked at, at Stripe: every PaymentIntent that names a StateGuard run in its metadata
(``stateguard_run``, set by the checkout agent), listed with auto-paging (``created`` from
``since`` on), its charge and that charge's refunds. In the ledger: every Stripe charge in
scope, each read at Stripe too (one that no listing covered: not tagged, or made earlier).

Drift, one line each:

* a charge at Stripe that the ledger lacks (``fix`` records it, when its run is in the journal);
* a refund at Stripe that the ledger lacks (``fix`` records it, undoing its charge, so that the
  charge's status is settled by the journal as for any refund);
* refunded amounts that differ, charged amounts that differ, and a ledger charge that Stripe
  cannot find: reported, never "fixed" (the ledger keeps what happened; a person looks).

Every effect recorded by a fix has an ``effect.reconciled`` audit event. The admin's "Verify with
Stripe" calls ``ledger_reconcile`` for the runs selected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import stripe
from django.conf import settings

from stateguard.effects import Effect as CoreEffect
from stateguard_web.payments import selectors
from stateguard_web.payments import stripe_client as stripe_module
from stateguard_web.payments.drift import SKEW, ReconcileError, Report, Scope, record_found, run_of
from stateguard_web.payments.selectors import STRIPE, ChargeUnreadable
from stateguard_web.payments.stripe_client import money
from stateguard_web.runs.services import By
from stateguard_web.sagas.models import Effect, Run

__all__ = ["StripeReconciler", "ledger_reconcile"]

RUN_KEY, STEP_KEY = "stateguard_run", "stateguard_step"  # the checkout agent's metadata keys
REFUNDED = ("succeeded", "pending")  # what Stripe counts in a charge's amount_refunded


class StripeReconciler:
    name, title = "stripe", "Stripe"

    def unconfigured(self) -> str | None:
        return None if settings.STRIPE_API_KEY else "STRIPE_API_KEY is empty"

    def reconcile(self, scope: Scope) -> Report:
        return ledger_reconcile(since=scope.since, runs=scope.runs, fix=scope.fix, by=scope.by)


@dataclass(slots=True)
class _Pass:
    client: stripe.StripeClient
    fix: bool
    by: By
    report: Report = field(default_factory=lambda: Report("Stripe", "charge"))
    compared: set[int] = field(default_factory=set)  # ledger charges already compared

    def drift(self, effect_id: str, run: str, message: str, fixed: bool = False) -> None:
        self.report.add(effect_id, run, message, fixed)

    # -- recording ------------------------------------------------------------------------
    def record(self, run: Run, step_id: str, node: str, effect: CoreEffect) -> Effect:
        record_found(run=run, effect=effect, by=self.by, step=(step_id, node))
        return Effect.objects.select_related("run").get(provider=STRIPE,
                                                        external_id=effect.external_id)

    # -- one charge -----------------------------------------------------------------------
    def intent(self, intent: Any, run_codes: set[str] | None) -> None:
        """A PaymentIntent listed at Stripe: its charge, in the ledger or not."""
        metadata = intent.metadata.to_dict() if intent.metadata else {}
        run_code = str(metadata.get(RUN_KEY) or "")
        charge_id = stripe_module.charge_id_of(intent)
        if not run_code or (run_codes is not None and run_code not in run_codes):
            return
        if intent.status != "succeeded" or charge_id is None:
            return  # nothing was charged
        effect = (Effect.objects.select_related("run")
                  .filter(provider=STRIPE, external_id__in=[intent.id, charge_id]).first())
        charge = self.client.v1.charges.retrieve(charge_id)
        if effect is None:
            effect = self.missing_charge(intent, charge, run_code, metadata)
            if effect is None:
                return
        self.compare(effect, charge)

    def missing_charge(self, intent: Any, charge: Any, run_code: str,
                       metadata: dict[str, Any]) -> Effect | None:
        what = (f"charged {money(charge.amount, charge.currency)} at Stripe ({charge.id}), "
                "not in the ledger")
        run = run_of(run_code)
        if run is None:
            self.drift(intent.id, run_code, f"{what}; its run is not in the journal, so it is "
                                             "not recorded")
            return None
        if not self.fix:
            self.report.compared += 1
            self.drift(intent.id, run_code, what)
            return None
        node = str(metadata.get(STEP_KEY) or "")
        step_id = (run.steps.filter(node=node).order_by("-started_at")
                   .values_list("step_id", flat=True).first()) if node else None
        effect = self.record(run, step_id or node or "reconcile", node, CoreEffect(
            STRIPE, "charge", str(intent.id), amount=int(charge.amount),
            currency=str(charge.currency)))
        self.drift(intent.id, run_code, f"{what}: recorded", fixed=True)
        return effect

    def compare(self, effect: Effect, charge: Any) -> None:
        """A ledger charge against its Stripe charge: amounts, and refunds one by one."""
        self.compared.add(effect.pk)
        self.report.compared += 1
        run = str(effect.run.code)
        currency = str(charge.currency or effect.currency)
        if effect.amount is not None and effect.amount != charge.amount:
            self.drift(effect.external_id, run,
                       f"charged {money(charge.amount, currency)} at Stripe, "
                       f"{money(effect.amount, currency)} in the ledger")
        refunds = [r for r in self.client.v1.refunds.list(
            params={"charge": charge.id, "limit": 100}).auto_paging_iter()
            if r.status in REFUNDED]
        known = set(Effect.objects.filter(provider=STRIPE, external_id__in=[r.id for r in refunds])
                    .values_list("external_id", flat=True))
        for refund in refunds:
            if refund.id in known:
                continue
            what = (f"refund {refund.id} of {money(refund.amount, currency)} is at Stripe, "
                    "not in the ledger")
            if self.fix:
                self.record(effect.run, effect.step_id, effect.node, CoreEffect(
                    STRIPE, "refund", str(refund.id), amount=int(refund.amount),
                    currency=currency, undoes=effect.external_id))
            self.drift(effect.external_id, run, what + (": recorded" if self.fix else ""),
                       fixed=self.fix)
        in_ledger = selectors.ledger_refunded(effect=effect)
        at_stripe = int(charge.amount_refunded or 0)
        if in_ledger != at_stripe:
            self.drift(effect.external_id, run, f"refunded {money(at_stripe, currency)} at "
                                                f"Stripe, {money(in_ledger, currency)} in the "
                                                "ledger")

    def ledger_charge(self, effect: Effect) -> None:
        """A ledger charge no listing covered: read at Stripe by its id."""
        try:
            charge = selectors.stripe_charge(self.client, effect.external_id)
        except ChargeUnreadable as exc:
            self.report.compared += 1
            self.drift(effect.external_id, str(effect.run.code), f"in the ledger, but {exc}")
            return
        self.compare(effect, charge)


def ledger_reconcile(*, since: datetime | None = None, runs: Iterable[Run] | None = None,
                     fix: bool = False, by: By = None,
                     client: stripe.StripeClient | None = None) -> Report:
    """Compare the ledger with Stripe: everything since ``since`` (PaymentIntents created and
    ledger charges recorded since), or the charges of ``runs``; with ``fix``, record what
    Stripe shows and the ledger lacks. ``ReconcileError`` if Stripe cannot be read."""
    run_list = list(runs) if runs is not None else None
    run_codes = {str(r.code) for r in run_list} if run_list is not None else None
    created_from = since
    if run_list:
        created_from = min(r.created_at for r in run_list) - SKEW
    done = _Pass(client or stripe_module.client(), fix, by)
    ledger = Effect.objects.filter(provider=STRIPE, kind="charge").select_related("run")
    if run_codes is not None:
        ledger = ledger.filter(run__code__in=run_codes)
    if since is not None:
        ledger = ledger.filter(recorded_at__gte=since)
    params: dict[str, Any] = {"limit": 100}
    if created_from is not None:
        params["created"] = {"gte": int(created_from.timestamp())}
    try:
        if run_list != []:
            for intent in done.client.v1.payment_intents.list(params=params).auto_paging_iter():
                done.intent(intent, run_codes)
        for effect in ledger.order_by("pk"):
            if effect.pk not in done.compared:
                done.ledger_charge(effect)
    except stripe.StripeError as exc:
        raise ReconcileError(selectors.stripe_error_message(exc)) from exc
    return done.report
