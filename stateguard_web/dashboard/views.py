"""The dashboard's pages and actions. Thin: parse, authorize (``accounts.access``), call one
service or read one page (``pages``).

Every action is a POST behind a confirmation; a user who may not operate gets a 403 and
nothing changes (the buttons are not shown to them either). A refusal by the service (the
run moved on, a request already waits for a worker) comes back as the page's message, in the
state machine's words. Then the run's page again (POST, redirect, GET), which shows the request
waiting for a worker until one takes it up.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import cache
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_POST

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.accounts.forms import LoginForm
from stateguard_web.dashboard import pages, workers
from stateguard_web.dashboard.forms import (
    CompensateForm,
    DecisionForm,
    ResolveForm,
    RunFilterForm,
)
from stateguard_web.runs import agent_map, runtime, selectors, services
from stateguard_web.sagas.models import Approval, Batch, Run


class LoginView(auth_views.LoginView):
    """Django's, with the throttled form: a lock-out is the page with its message, as 429."""

    form_class = LoginForm
    redirect_authenticated_user = True

    def form_invalid(self, form: LoginForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.throttled is not None:
            response.status_code = 429
            response["Retry-After"] = str(form.throttled.retry_after)
        return response


def _run_for(request: HttpRequest, code: uuid.UUID, ability: Ability) -> Run:
    """The run ``code`` if the user may ``ability`` to it: 403 if it may not to any run, 404
    if there is no such run or it may not see it (a submitter learns nothing of the others)."""
    access.check(request.user, ability)
    try:
        run = selectors.run_get(code=code)
        access.check(request.user, ability, run)
    except selectors.RunNotFound as exc:
        raise Http404(str(exc)) from None
    return run


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    access.check(request.user, Ability.VIEW)
    form = RunFilterForm(request.GET)
    filters = form.filters()
    page = pages.run_list_page(user=request.user, **filters)
    agents = runtime.agent_names()
    if filters["agent"] and filters["agent"] not in agents:
        agents = [*agents, filters["agent"]]
    query = request.GET.copy()
    query.pop("page", None)
    chip_query = query.copy()
    chip_query.pop("status", None)
    whole = query.copy()  # the list without the map's narrowing (dashboard/agent_map.py)
    for key in ("node", "what"):
        whole.pop(key, None)
    return render(request, "dashboard/runs.html", {
        "form": form, "page": page, "agents": agents, "filters": filters,
        "query": query.urlencode(), "chip_query": chip_query.urlencode(),
        "filtered": any(filters[k] for k in ("agent", "q", "created_after", "created_before",
                                             "node")),
        "stopped": stopped_words(filters["node"], filters["what"]),
        "unstopped": whole.urlencode(), "map_url": _map_url(filters["agent"], request),
        # Batches (dashboard/batches.py): tick runs, or take every run of this filter.
        "can_operate": access.may(request.user, Ability.OPERATE),
        "filter_params": [(k, v) for k, v in query.items()],
        "batch_actions": Batch.Action.choices,
    })


def _map_url(agent: str, request: HttpRequest) -> str:
    """The agent's map, over the list's window if it has one of the map's."""
    if agent not in runtime.agent_names():
        return ""
    window = request.GET.get("range", "")
    return reverse("dashboard:agent_map", args=[agent]) + (
        f"?window={window}" if window in agent_map.WINDOWS else "")


def stopped_words(node: str, what: str) -> str:
    """What a list narrowed by an agent's map holds: "failed at charge_card"."""
    if not node:
        return ""
    stop = agent_map.STOPS.get(what)
    return (f"{stop.words.removesuffix('it')}{node}" if stop
            else f"that stand or stopped at {node}")


@login_required
def run_detail(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    run = _run_for(request, code, Ability.VIEW)
    page = pages.run_page(run=run, user=request.user)
    return render(request, "dashboard/run_detail.html", {
        "run": run, "page": page, "confirm": request.GET.get("confirm", ""),
        "decision_form": DecisionForm(), "compensate_form": CompensateForm(),
        "resolve_form": ResolveForm(),
    })


@login_required
def inbox_approvals(request: HttpRequest) -> HttpResponse:
    access.check(request.user, Ability.VIEW)
    waiting = pages.approvals_waiting(request.user)
    return render(request, "dashboard/inbox_approvals.html", {
        "approvals": waiting[:pages.INBOX_LIMIT], "count": waiting.count(),
        "limit": pages.INBOX_LIMIT})


@login_required
def inbox_attention(request: HttpRequest) -> HttpResponse:
    access.check(request.user, Ability.VIEW)
    runs = pages.runs_needing_attention(request.user).prefetch_related("compensations")
    return render(request, "dashboard/inbox_attention.html", {
        "runs": runs[:pages.INBOX_LIMIT], "count": runs.count(), "limit": pages.INBOX_LIMIT})


@login_required
def inbox_counts(request: HttpRequest) -> JsonResponse:
    """The navigation's counts, for pages that keep them live without re-reading themselves."""
    access.check(request.user, Ability.VIEW)
    return JsonResponse(pages.inbox_counts(request.user))


@login_required
def workers_banner(request: HttpRequest) -> HttpResponse:
    """The banner that says no worker is alive (empty while one is), for the pages that ask
    for it again (dashboard.js): nothing is published when a worker dies or starts."""
    access.check(request.user, Ability.VIEW)
    return render(request, "includes/workers.html",
                  {"workers": workers.worker_health(request.user)})


# -- actions ------------------------------------------------------------------------------

def _act(request: HttpRequest, run: Run, act: Callable[[], Any], done: str) -> HttpResponse:
    try:
        act()
    except services.ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done)
    return redirect("dashboard:run", code=run.code)


def _decide(request: HttpRequest, code: uuid.UUID, decide: Callable[..., Run],
            verb: str, then: str) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose an approval to decide.")
        return redirect("dashboard:run", code=run.code)
    try:
        approval = selectors.approval_get(run=run, pk=form.cleaned_data["approval"])
    except selectors.NotFound as exc:
        messages.error(request, str(exc))
        return redirect("dashboard:run", code=run.code)

    def act() -> None:
        # The approval the operator was shown, and no other: if it was decided meanwhile
        # (by someone else), say so instead of deciding the run's next one.
        if approval.status != Approval.Status.PENDING:
            by = f" by {approval.decided_by}" if approval.decided_by else ""
            raise services.ActionNotAllowed(
                f"The approval of {approval.node} is no longer pending: it was "
                f"{approval.status}{by}.")
        decide(run=run, by=services.Actor(request.user), step_id=approval.step_id,
               reason=form.cleaned_data["reason"])

    return _act(request, run, act, f"{verb} {approval.node}. {then}")


@login_required
@require_POST
def run_approve(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    return _decide(request, code, services.run_approve, "Approved",
                   "A worker runs the step now.")


@login_required
@require_POST
def run_reject(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    return _decide(request, code, services.run_reject, "Rejected",
                   "A worker unwinds the run now.")


@login_required
@require_POST
def run_retry(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    return _act(request, run,
                lambda: services.run_retry(run=run, by=services.Actor(request.user)),
                "Retry requested: a worker resumes the run from where it failed.")


@login_required
@require_POST
def run_compensate(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    form = CompensateForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    return _act(request, run,
                lambda: services.run_compensate(run=run, by=services.Actor(request.user),
                                                reason=reason),
                "Compensation requested: a worker undoes the run's steps, newest first.")


@login_required
@require_POST
def run_resolve(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say what was done by hand: the note is required.")
        return redirect("dashboard:run", code=run.code)
    return _act(request, run,
                lambda: services.run_resolve_by_hand(run=run, by=services.Actor(request.user),
                                                     note=form.cleaned_data["note"]),
                "Resolved by hand: the run is compensated.")


@login_required
@require_POST
def compensation_retry(request: HttpRequest, code: uuid.UUID, pk: int) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    compensation = run.compensations.select_related("run", "step").filter(pk=pk).first()
    if compensation is None:
        raise Http404(f"run {run.code} has no compensation {pk}")
    return _act(request, run,
                lambda: services.compensation_retry(compensation=compensation,
                                                    by=services.Actor(request.user)),
                f"Retry of the compensation of {compensation.node} requested: a worker runs "
                "it again, with the same idempotency key.")


@cache
def _favicon() -> bytes:
    return (settings.BASE_DIR / "static" / "favicon.ico").read_bytes()


@require_GET
@cache_control(public=True, max_age=86_400)
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask for on every page (the admin's and the API docs'
    too): served here so that a deployment whose proxy serves only /static/ has it as well,
    and no page leaves a 404 in the log."""
    return HttpResponse(_favicon(), content_type="image/x-icon")
