"""Refunds by hand: a charge of the ledger, or every charge of a run, refunded at Stripe once.

What makes a refund happen once, whoever asks at the same time (two admins, a double submit,
a worker's compensation):

1. The run's row is locked and a refund is refused while a worker holds the run's lease: the
   run's own compensation refunds the same charge (it re-reads Stripe, but not under our
   lock), and a worker that wants the lease waits until this refund is recorded.
2. The charge's ledger row is locked (``select_for_update``): a second refund of it waits.
3. Then the charge is read again at Stripe. What remains is what Stripe charged less what it
   refunded, and never more than the ledger's amount less the refunds it holds. A caller that
   says what it showed the operator (``seen_refunded``: the confirmation page does) has a
   charge that was refunded meanwhile refused, not refunded again: that is what tells a double
   submit of a partial refund from a second partial refund.
4. The refund is sent once (no SDK resend), with a key made of the charge, what was refunded
   before and the amount (the same refund asked again is the same key), and metadata naming
   the run and the operator.
5. In the same transaction: the refund in the ledger (the Django journal's ``effect_record``,
   which settles the charge's status), an ``AuditEvent``, and, when asked, the run resolved by
   hand (``runs.services.run_resolve_by_hand``).

Errors: ``RefundError`` (a ``ServiceError``), its message written for the operator. When
Stripe refuses or fails, nothing is recorded as refunded (an ``effect.refund_failed`` audit
event says who tried); when its answer was lost the refund may have happened, which the next
attempt's re-read, or ``reconcile_effects``, finds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import stripe
from django.db import transaction

from stateguard import lifecycle
from stateguard.effects import Effect as CoreEffect
from stateguard.effects import EffectRecord
from stateguard.lifecycle import Action
from stateguard_web.payments import selectors
from stateguard_web.payments import stripe_client as stripe_module
from stateguard_web.payments.selectors import ChargeState, ChargeUnreadable
from stateguard_web.runs import runtime
from stateguard_web.runs.services import (
    ActionNotAllowed,
    By,
    ServiceError,
    _actor,
    _audit,
    _text,
    run_resolve_by_hand,
)
from stateguard_web.sagas.journal import leases
from stateguard_web.sagas.models import Effect, Run

__all__ = ["MAX_REASON", "Refund", "RefundError", "effect_refund", "run_refund"]

log = logging.getLogger(__name__)

MAX_REASON = 500  # Stripe keeps at most 500 characters in a metadata value


class RefundError(ServiceError):
    """The refund was refused or failed; nothing was recorded as refunded."""


@dataclass(frozen=True, slots=True)
class Refund:
    """A refund made: of which ledger charge, Stripe's id, how much; and the run's resolution
    when it was asked for (``resolve_refused`` says why it was not done)."""

    charge: Effect
    refund_id: str
    amount: int
    currency: str
    resolved: bool = False
    resolve_refused: str = ""

    def __str__(self) -> str:
        return (f"refunded {stripe_module.money(self.amount, self.currency)} of "
                f"{self.charge.external_id} (Stripe refund {self.refund_id})")


def _reason(reason: str) -> str:
    try:
        reason = _text(reason, "reason", MAX_REASON)
    except ActionNotAllowed as exc:
        raise RefundError(str(exc)) from None
    if not reason.strip():
        raise RefundError("say why this is refunded (a reason is required)")
    return reason.strip()


def _run_for_refund(run: Run, *, resolve: bool) -> Run:
    """The run, locked; refused while a worker holds it, or when asked to resolve a run that
    cannot be resolved (checked before any money moves, not after)."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if Run.objects.filter(leases.held(), pk=run.pk).exists():  # by the database's clock
        raise RefundError(f"run {run.code} is being worked on right now (its compensation may "
                          "be refunding this charge); try again when the worker is done")
    if resolve:
        why = lifecycle.refusal(Action.RESOLVE, run.status, run=str(run.code))
        if why is not None:
            raise RefundError(f"cannot resolve: {why}")
    return run


def _check_amount(state: ChargeState, amount: int | None, seen_refunded: int | None) -> int:
    charge = state.effect.external_id
    if seen_refunded is not None and seen_refunded != state.refunded:
        raise RefundError(
            f"{charge} changed since it was shown: Stripe now says {state.show(state.refunded)} "
            f"is refunded, not {state.show(seen_refunded)}. Nothing was refunded; look again.")
    if state.charge_status != "succeeded":
        raise RefundError(f"{charge} is {state.charge_status} at Stripe: nothing to refund")
    if state.remaining <= 0:
        raise RefundError(f"nothing remains to be refunded of {charge}: "
                          f"{state.show(state.refunded)} of {state.show(state.charged)} "
                          "is refunded already")
    if amount is None:
        return state.remaining
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
        raise RefundError("the amount must be a positive whole number (in the currency's "
                          "smallest unit, e.g. cents)")
    if amount > state.remaining:
        raise RefundError(f"{state.show(amount)} is more than remains to be refunded of "
                          f"{charge}: at most {state.show(state.remaining)} "
                          f"({state.remaining})")
    return amount


def _send(client: stripe.StripeClient, state: ChargeState, *, amount: int, run: Run,
          reason: str, by: By) -> tuple[Any, str]:
    # The same refund asked again (same charge, same refunded-before, same amount) has the same
    # key, so Stripe answers it once even if our lock were bypassed; a later, different refund
    # of the same charge gets another.
    key = f"stateguard:manual-refund:{state.charge_id}:{state.refunded}:{amount}"
    metadata = {"stateguard_run": str(run.code), "stateguard_by": _actor(by)[:500],
                "stateguard_reason": reason, "stateguard_effect": state.effect.external_id}
    try:
        refund = client.v1.refunds.create(
            params={"charge": state.charge_id, "amount": amount, "metadata": metadata},
            options=stripe_module.ONCE | {"idempotency_key": key})
    except stripe.APIConnectionError as exc:
        raise RefundError(f"refund of {state.effect.external_id}: "
                          f"{selectors.stripe_error_message(exc)}, so the refund may or may "
                          "not have been made; nothing was recorded. Look at the charge again "
                          "(or Verify with Stripe) before trying again.") from exc
    except stripe.StripeError as exc:
        raise RefundError(f"refund of {state.effect.external_id} failed, nothing was "
                          f"refunded: {selectors.stripe_error_message(exc)}") from exc
    return refund, key


def _record(state: ChargeState, refund: Any, key: str, run: Run, by: By, reason: str) -> None:
    charge = state.effect
    # The journal's own recording: one row per refund id, and the charge's status settled
    # under its row lock (applied → partially_compensated → compensated).
    runtime.journal().effect_record(EffectRecord(
        str(run.code), charge.step_id, charge.node,
        CoreEffect(charge.provider, "refund", str(refund.id), amount=int(refund.amount),
                   currency=str(refund.currency or state.currency), idempotency_key=key,
                   undoes=charge.external_id)))
    _audit(run, by, "effect.refunded", charge=charge.external_id, stripe_charge=state.charge_id,
           refund=str(refund.id), amount=int(refund.amount), currency=state.currency,
           reason=reason)


def _resolve(run: Run, by: By, note: str) -> str:
    """Resolve the run in this transaction; its refusal leaves the refund recorded (a
    savepoint), since the money has moved whatever the run's state says."""
    try:
        with transaction.atomic():
            run_resolve_by_hand(run=run, by=by, note=note[:2000])
    except ActionNotAllowed as exc:
        return str(exc)
    return ""


def effect_refund(*, effect: Effect, amount: int | None = None, reason: str, by: By,
                  seen_refunded: int | None = None, resolve: bool = False,
                  client: stripe.StripeClient | None = None) -> Refund:
    """Refund ``amount`` (smallest unit; everything that remains when None) of the ledger
    charge ``effect`` at Stripe, record it, and with ``resolve`` mark its run resolved by hand
    in the same transaction. ``seen_refunded``: what Stripe's refunded amount was when the
    operator decided (the refund is refused if it moved). See the module docstring."""
    reason = _reason(reason)
    client = client or stripe_module.client()
    try:
        with transaction.atomic():
            run = _run_for_refund(effect.run, resolve=resolve)
            charge = Effect.objects.select_for_update().get(pk=effect.pk)
            try:
                state = selectors.charge_state(effect=charge, client=client)
            except ChargeUnreadable as exc:
                raise RefundError(str(exc)) from exc
            amount = _check_amount(state, amount, seen_refunded)
            refund, key = _send(client, state, amount=amount, run=run, reason=reason, by=by)
            try:
                _record(state, refund, key, run, by, reason)
            except Exception:  # the money moved: say so loudly, reconcile_effects records it
                log.exception("refund %s of %s made at Stripe but not recorded; run "
                              "manage.py reconcile_effects --fix", refund.id, charge.external_id)
                raise
            done = Refund(charge, str(refund.id), int(refund.amount), state.currency)
            if resolve:
                why = _resolve(run, by, f"{done} by hand: {reason}")
                done = Refund(charge, done.refund_id, done.amount, done.currency,
                              resolved=not why, resolve_refused=why)
    except RefundError as exc:
        if isinstance(exc.__cause__, stripe.StripeError):  # tried at Stripe: keep a trace
            _audit(effect.run, by, "effect.refund_failed", charge=effect.external_id,
                   error=str(exc)[:2000], reason=reason)
        raise
    return done


def run_refund(*, run: Run, reason: str, by: By, seen_refunded: dict[int, int] | None = None,
               resolve: bool = False, amount: int | None = None,
               client: stripe.StripeClient | None = None) -> list[Refund]:
    """Refund what remains of every Stripe charge of ``run`` (``amount`` only when it has one
    charge), each as ``effect_refund`` does, in its own transaction: a refund made is recorded
    even if a later one fails (the ``RefundError`` then says what was done). With ``resolve``
    the run is resolved in the transaction of its last refund, once all the others are made.
    ``seen_refunded``: charge pk → Stripe's refunded amount when the operator decided."""
    reason = _reason(reason)
    why = lifecycle.refusal(Action.RESOLVE, run.status, run=str(run.code)) if resolve else None
    if why is not None:  # before any money moves (checked again, locked, with the last refund)
        raise RefundError(f"cannot resolve: {why}")
    client = client or stripe_module.client()
    charges = list(selectors.run_charges(run=run))
    if not charges:
        raise RefundError(f"run {run.code} has no Stripe charge in the ledger")
    if amount is not None and len(charges) != 1:
        raise RefundError(f"run {run.code} has {len(charges)} charges: refund a part of one "
                          "from the ledger, charge by charge")
    seen = seen_refunded or {}
    todo = []
    for charge in charges:
        try:
            state = selectors.charge_state(effect=charge, client=client)
        except ChargeUnreadable as exc:
            raise RefundError(str(exc)) from exc
        if state.remaining > 0 or charge.pk in seen:
            todo.append(charge)
    if not todo:
        raise RefundError(f"nothing remains to be refunded of run {run.code}'s "
                          f"{len(charges)} charge(s)")
    done: list[Refund] = []
    for i, charge in enumerate(todo):
        try:
            done.append(effect_refund(effect=charge, amount=amount, reason=reason, by=by,
                                      seen_refunded=seen.get(charge.pk),
                                      resolve=resolve and i == len(todo) - 1, client=client))
        except RefundError as exc:
            if not done:
                raise
            made = "; ".join(str(d) for d in done)
            raise RefundError(f"{made}; then {exc} (nothing more was tried)") from exc
    return done
