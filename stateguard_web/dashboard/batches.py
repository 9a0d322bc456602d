"""Batches on the dashboard: select runs on the list (or take every run the list's filter
matches), confirm, and watch the batch's page fill in live (``batches`` does the work).

The confirmation is a page of its own (a GET, so it also works without the page's script): it
shows how many runs of which statuses the action would touch and how many it fits now, and its
form posts exactly those runs (their codes), so the batch acts on what the operator confirmed,
also when the filter would match other runs a moment later. Thin, like ``views``: parse,
authorize (``accounts.access``), call one service.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.batches import services as batches
from stateguard_web.dashboard import labels
from stateguard_web.dashboard.incidents import failure_words
from stateguard_web.runs import selectors, services
from stateguard_web.runs.filters import RunFilterForm
from stateguard_web.sagas.models import Batch, BatchItem, Run

# What each action does to one run, for the confirmation.
WHAT = {Batch.Action.RETRY: "resumes each failed run from where it failed",
        Batch.Action.COMPENSATE: "undoes what each run did, newest step first",
        Batch.Action.RETRY_COMPENSATIONS: "runs the failed compensations of each run that "
                                          "needs attention again, with their idempotency keys"}
# Where the batch's reason goes (batches.services.batch_create): a compensation request takes
# one; a retry does not.
REASON_GOES = {
    Batch.Action.RETRY: "kept with the batch and shown on its page",
    Batch.Action.COMPENSATE: "kept with the batch, and with each run's compensation request "
                             "in its audit trail",
    Batch.Action.RETRY_COMPENSATIONS: "kept with the batch, and with each run's compensation "
                                      "request in its audit trail",
}


def what_happened(item: BatchItem) -> str:
    """An item's outcome in words. "done" means the action was requested for the run (and
    audited): whether a worker has carried it out is the run's to say, so say it."""
    if item.outcome == BatchItem.Outcome.PENDING:
        return ""
    if item.outcome != BatchItem.Outcome.DONE:
        return item.reason
    if item.run is None:
        return "Requested; the run was deleted since."
    waiting = item.run.waiting_request
    if waiting:
        return f"Requested ({waiting}): it waits for a worker to take it up."
    now = labels.label("run", item.run.status).words
    return f"Requested, and a worker took it up: the run is {now} now."


class BatchForm(forms.Form):
    """The list's batch form: an action, and the runs ticked or every run of the filter."""

    action = forms.ChoiceField(choices=Batch.Action.choices)
    scope = forms.ChoiceField(choices=[("selected", "the runs ticked"),
                                       ("filter", "every run matching the filter")],
                              required=False)
    runs = forms.CharField(required=False, widget=forms.HiddenInput)  # codes, comma-separated
    reason = forms.CharField(required=False, max_length=2000, strip=True)

    def codes(self, ticked: list[str]) -> list[uuid.UUID]:
        """The runs named (the list's ticks, or the confirmation's field); bad ones dropped."""
        named = ticked or [c for c in (self.cleaned_data.get("runs") or "").split(",") if c]
        found = []
        for code in named[:settings.STATEGUARD_BATCH_MAX_RUNS + 1]:
            try:
                found.append(uuid.UUID(code.strip()))
            except ValueError:
                continue
        return found


def described(filters: dict[str, Any]) -> str:
    """The runs a filter selects, in words, for the confirmation: "The runs of checkout that
    last failed at charge_user with APIConnectionError, failed now." (an Incidents group's)."""
    words = "The runs"
    if filters.get("agent"):
        words += f" of {filters['agent']}"
    failed = failure_words(filters.get("step") or "", filters.get("error_type") or "")
    if failed:
        words += f" that last failed {failed}"
    if filters.get("q"):
        words += f" matching “{filters['q']}”"
    statuses = filters.get("status") or []
    if statuses:  # one, or several: "failed or needs attention now"
        words += f", {' or '.join(labels.label('run', s).words for s in statuses)} now"
    return words + "."


def _list_url(request: HttpRequest) -> str:
    """The runs list as the operator left it (its filters, not the batch's fields)."""
    query = request.GET.copy()
    for name in ("action", "scope", "runs", "reason"):
        query.pop(name, None)
    return reverse("dashboard:runs") + (f"?{query.urlencode()}" if query else "")


@login_required
def batch_new(request: HttpRequest) -> HttpResponse:
    """The confirmation: what the batch would touch, and the button that makes it."""
    access.check(request.user, Ability.OPERATE)
    form = BatchForm(request.GET)
    if not form.is_valid():
        messages.error(request, "Choose what to do with the runs.")
        return redirect(_list_url(request))
    action = form.cleaned_data["action"]
    runs = access.visible_runs(request.user)
    if form.cleaned_data["scope"] == "filter":
        filters = RunFilterForm(request.GET).filters()
        for name in ("page", "sort"):  # the list's, not a filter
            filters.pop(name)
        selection: dict[str, Any] = {"filters": {k: v or None for k, v in filters.items()}}
        words = described(filters)
    else:
        selection = {"codes": form.codes(request.GET.getlist("runs"))}
        words = ""
    try:
        preview = batches.batch_preview(action=action, runs=runs, **selection)
    except batches.BatchRefused as exc:
        messages.error(request, f"No batch: {exc}.")
        return redirect(_list_url(request))
    return render(request, "dashboard/batch_new.html", {
        "form": form, "action": Batch.Action(action), "what": WHAT[Batch.Action(action)],
        "reason_goes": REASON_GOES[Batch.Action(action)],
        "preview": preview, "codes": ",".join(preview["runs"]),
        "skipped": preview["count"] - preview["eligible"], "back": _list_url(request),
        "described": words})


@login_required
@require_POST
def batch_create(request: HttpRequest) -> HttpResponse:
    access.check(request.user, Ability.OPERATE)
    form = BatchForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose what to do with the runs.")
        return redirect("dashboard:runs")
    try:
        batch = batches.batch_create(action=form.cleaned_data["action"],
                                     by=services.Actor(request.user),
                                     runs=access.visible_runs(request.user),
                                     codes=form.codes([]), reason=form.cleaned_data["reason"])
    except batches.BatchRefused as exc:
        messages.error(request, f"No batch: {exc}.")
        return redirect("dashboard:runs")
    messages.success(request, f"Batch started: a worker goes through its {batch.items.count()} "
                              "runs one by one; below, what became of each.")
    return redirect("dashboard:batch", code=batch.code)


def _batch_for(request: HttpRequest, code: uuid.UUID, ability: Ability) -> Batch:
    """A batch is about everyone's runs: for those who may see every run (404 otherwise)."""
    access.check(request.user, ability)
    if not access.reads_all_runs(request.user):
        raise Http404(f"no batch {code}")
    try:
        return batches.batch_get(code=code)
    except selectors.NotFound as exc:
        raise Http404(str(exc)) from None


@login_required
def batch_detail(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    batch = _batch_for(request, code, Ability.VIEW)
    items = [(item, what_happened(item))
             for item in batch.items.order_by("position").select_related("run")]
    counts = batches.batch_counts(batch=batch)
    settled = counts["total"] - counts["pending"]
    return render(request, "dashboard/batch.html", {
        "batch": batch, "items": items, "counts": counts,
        "percent": round(100 * settled / counts["total"]) if counts["total"] else 100,
        "may_cancel": batch.finished_at is None and access.may(request.user, Ability.OPERATE),
        "confirm": request.GET.get("confirm", ""), "outcomes": BatchItem.Outcome,
        "statuses": Run.Status})


@login_required
@require_POST
def batch_cancel(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    batch = _batch_for(request, code, Ability.OPERATE)
    try:
        batch = batches.batch_cancel(batch=batch, by=services.Actor(request.user))
    except services.ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Batch cancelled: the runs not reached yet are skipped.")
    return redirect("dashboard:batch", code=batch.code)
