"""The refund confirmation, one for every page that offers refunds (the admin's, the run page's
on the dashboard): the charges as Stripe and the ledger show them now, the ``RefundForm`` for
them and, when that form is posted, the refund (``services``) or why none was made.

A page renders a ``RefundConfirmation`` and nothing more: which charges, who refunds and whether
the run may be resolved in the same step are its decisions; what is shown, checked and refunded
is this module's, so that the two pages cannot drift apart::

    confirmation = refund_confirm(run=run, charges=[charge], by=user, data=request.POST)
    if confirmation.done:  # refunded: say so, and go back
        ...
    render(..., status=409 if confirmation.refused else 200)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import stripe
from django.contrib import messages

from stateguard import lifecycle
from stateguard.lifecycle import Action
from stateguard_web.payments import selectors, services
from stateguard_web.payments import stripe_client as stripe_module
from stateguard_web.payments.forms import RefundForm, seen_token
from stateguard_web.payments.selectors import ChargeState, ChargeUnreadable
from stateguard_web.runs.services import By
from stateguard_web.sagas.models import Effect, Run

__all__ = ["RefundConfirmation", "refund_confirm"]


@dataclass(slots=True)
class RefundConfirmation:
    """What a refund page shows: ``states`` (None when Stripe cannot be read), the ``form``
    (None when nothing can be refunded now), an ``error`` for the operator; after a post,
    the refunds ``done``, or ``refused`` (a post that refunded nothing: the page's 409)."""

    states: list[ChargeState] | None
    form: RefundForm | None
    error: str = ""
    done: list[services.Refund] = field(default_factory=list)
    refused: bool = False

    @property
    def total_remaining(self) -> str:
        """What remains to be refunded of every charge shown, in words."""
        states = self.states or []
        currencies = {s.currency for s in states}
        total = sum(s.remaining for s in states)
        return stripe_module.money(total, currencies.pop()) if len(currencies) == 1 \
            else str(total)

    def told(self) -> list[tuple[int, str]]:
        """The messages (level, text) that say what was done, for the page the operator goes
        back to."""
        said = [(messages.SUCCESS, f"{str(r)[:1].upper()}{str(r)[1:]}.") for r in self.done]
        last = self.done[-1] if self.done else None
        if last is not None and last.resolved:
            said.append((messages.SUCCESS, f"Run {last.charge.run.code} is resolved "
                                           "(compensated by hand)."))
        elif last is not None and last.resolve_refused:
            said.append((messages.WARNING, f"The run was not resolved: {last.resolve_refused}"))
        return said


def _states(charges: list[Effect], client: stripe.StripeClient
            ) -> tuple[list[ChargeState] | None, str]:
    try:
        return [selectors.charge_state(effect=c, client=client) for c in charges], ""
    except ChargeUnreadable as exc:
        return None, f"Stripe cannot be read now, so nothing can be refunded: {exc}"


def _form(states: list[ChargeState] | None, offers_resolve: bool,
          data: dict[str, Any] | None = None) -> RefundForm | None:
    """A new form for what Stripe shows now, or None when nothing can be refunded."""
    if not states or not any(s.remaining > 0 for s in states):
        return None
    return RefundForm(initial={**(data or {}), "seen": seen_token(states)}, states=states,
                      offers_resolve=offers_resolve)


def _refund(run: Run, charges: list[Effect], data: dict[str, Any],
            by: By) -> list[services.Refund]:
    seen: dict[int, int] = data["seen"]
    resolve = bool(data.get("resolve"))
    if len(charges) == 1:  # one charge's page: this charge only
        charge = charges[0]
        if charge.pk not in seen:
            raise services.RefundError("nothing remained to be refunded of "
                                       f"{charge.external_id} when this page was shown; "
                                       "look again")
        return [services.effect_refund(effect=charge, amount=data.get("amount"),
                                       reason=data["reason"], by=by,
                                       seen_refunded=seen[charge.pk], resolve=resolve)]
    return services.run_refund(run=run, amount=data.get("amount"), reason=data["reason"],
                               by=by, seen_refunded=seen, resolve=resolve)


def refund_confirm(*, run: Run, charges: list[Effect], by: By,
                   data: Mapping[str, Any] | None = None,
                   may_resolve: bool = True) -> RefundConfirmation:
    """The confirmation of a refund of ``charges`` (Stripe charges of ``run``'s ledger, all of
    it when several): read at Stripe now; with ``data`` (the posted form) the refund too, by
    ``by``. "Also resolve the run" is offered when ``may_resolve`` and the run can be resolved
    now. A refund refused or failed comes back as ``error``, with the charges as Stripe has
    them after it and a new form that keeps the operator's amount and reason."""
    client = stripe_module.client()
    offers_resolve = may_resolve and lifecycle.refusal(Action.RESOLVE, run.status) is None
    states, error = _states(charges, client)
    form = _form(states, offers_resolve)
    done: list[services.Refund] = []
    refused = data is not None  # unless the form is wrong or the refund made
    if form is not None and data is not None:
        form = RefundForm(data, states=form.states, offers_resolve=offers_resolve)
        refused = form.is_valid()
        if form.is_valid():
            try:
                done = _refund(run, charges, form.cleaned_data, by)
            except services.RefundError as exc:
                states, unreadable = _states(charges, client)  # as it is now
                error = f"{exc} {unreadable}".strip()
                form = _form(states, offers_resolve, {
                    k: form.cleaned_data.get(k) for k in ("amount", "reason")})
            else:
                refused = False
    if states and form is None:
        error = error or "Nothing remains to be refunded."
    return RefundConfirmation(states, form, error, done, refused)
