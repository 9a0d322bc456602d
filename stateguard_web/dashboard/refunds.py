"""Refunds from a run's page: the effect ledger's "Refund…" on a Stripe charge opens this
confirmation, the admin's own (``payments.confirmation``): the charge as Stripe and the ledger
show it now, an amount (empty: all that remains), a reason, and "Also resolve the run" when
the run needs attention and the user may operate it. The refund is made once, through
``payments.services``, which also audits it.

A page of its own, not a dialog of the run's page: it reads the charge at Stripe, which the
run's page, re-read on every live update, must not do. Thin, like ``views``: parse, authorize
(``Ability.REFUND``: without it the ledger shows no action and this page is a 403), confirm.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.dashboard.views import _run_for
from stateguard_web.payments import selectors
from stateguard_web.payments.confirmation import refund_confirm
from stateguard_web.runs import services


@login_required
@require_http_methods(["GET", "POST"])
def effect_refund(request: HttpRequest, code: uuid.UUID, pk: int) -> HttpResponse:
    run = _run_for(request, code, Ability.REFUND)
    charge = selectors.run_charges(run=run).filter(pk=pk).first()
    if charge is None:
        raise Http404(f"run {run.code} has no Stripe charge {pk} in its ledger")
    confirmation = refund_confirm(
        run=run, charges=[charge], by=services.Actor(request.user),
        data=request.POST if request.method == "POST" else None,
        may_resolve=access.may(request.user, Ability.OPERATE, run))
    back = reverse("dashboard:run", args=[run.code])
    if confirmation.done:
        for level, text in confirmation.told():
            messages.add_message(request, level, text)
        return redirect(back)
    return render(request, "dashboard/refund.html", {
        "run": run, "charge": charge, "confirmation": confirmation, "form": confirmation.form,
        "back": back}, status=409 if confirmation.refused else 200)
