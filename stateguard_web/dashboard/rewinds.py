"""Retry from an earlier step, from a run's page: a step's "Retry from here…" opens this
confirmation. It lists what will be undone first, newest first (each step that had an effect
at or after the chosen one, and whether it has a compensation), says what runs again, and takes
an optional update of the agent's state (JSON). Confirmed, ``services.run_retry`` leaves the
request for a worker (``stateguard.rewind`` does the rest).

A page of its own, not a dialog of the run's page: it reads the thread's checkpoints to know
what a retry from the step would undo, which the run's page, re-read on every live update, must
not do for each of its steps. Thin, like ``views``: parse, authorize, confirm.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from stateguard import lifecycle
from stateguard.lifecycle import Action
from stateguard_web.accounts.access import Ability
from stateguard_web.dashboard.forms import RetryFromForm
from stateguard_web.dashboard.views import _run_for
from stateguard_web.runs import selectors, services


@login_required
@require_http_methods(["GET", "POST"])
def run_retry_from(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    data = request.POST if request.method == "POST" else None
    step = (data or request.GET).get("step", "")
    try:
        seen = selectors.run_rewind(run=run, from_step=step)
    except (selectors.StepNotFound, KeyError) as exc:
        raise Http404(str(exc)) from None
    plan = seen.plan
    refused = lifecycle.refusal(Action.RETRY_FROM, run.status, run=str(run.code),
                                waiting=run.waiting_request, pivot=plan.pivot,
                                undone=seen.undone)
    form = RetryFromForm(data, initial={"step": plan.step.step_id})
    back = reverse("dashboard:run", args=[run.code])
    error = refused
    if data is not None and refused is None and form.is_valid():
        try:
            services.run_retry(run=run, by=services.Actor(request.user),
                               from_step=form.cleaned_data["step"],
                               update=form.cleaned_data["update"])
        except services.ServiceError as exc:
            error = str(exc)
        else:
            messages.success(request, f"Retry from {plan.step.node} requested: a worker undoes "
                                      "the steps listed, newest first, then runs the run again "
                                      f"from before {plan.step.node}.")
            return redirect(back)
    return render(request, "dashboard/retry_from.html", {
        "run": run, "plan": plan, "compensated": seen.compensated, "form": form,
        "error": error, "refused": refused, "back": back},
        status=409 if refused else 422 if error or (data is not None and form.errors) else 200)
