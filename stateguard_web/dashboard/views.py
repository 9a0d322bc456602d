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
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET, require_POST

from stateguard_web.accounts import access
from stateguard_web.accounts import selectors as account_selectors
from stateguard_web.accounts.access import Ability
from stateguard_web.accounts.forms import LoginForm
from stateguard_web.dashboard import chart, live, pages, workers
from stateguard_web.dashboard.forms import (
    CompensateForm,
    DecisionForm,
    ResolveForm,
    TerminateForm,
)
from stateguard_web.dashboard.incidents import failure_words
from stateguard_web.monitoring import heartbeat
from stateguard_web.monitoring import workers as monitoring
from stateguard_web.runs import agent_map, runtime, selectors, services, versions
from stateguard_web.runs.filters import RunFilterForm, kept
from stateguard_web.sagas.models import Approval, Batch, Run
from stateguard_web.webhooks import selectors as webhooks


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
    return live.page(request, "dashboard/runs.html",
                     lambda: _run_list_context(request, form, filters),
                     regions=["dashboard/live/runs.html"])


def _run_list_context(request: HttpRequest, form: RunFilterForm,
                      filters: dict[str, Any]) -> dict[str, Any]:
    page = pages.run_list_page(user=request.user, **filters)
    agents = runtime.agent_names()
    if filters["agent"] and filters["agent"] not in agents:
        agents = [*agents, filters["agent"]]
    query = request.GET.copy()
    query.pop("page", None)
    # Each narrowing's "every run" link drops that narrowing alone and keeps the other: the
    # map's node and what (dashboard/agent_map.py), an Incidents group's step and error type.
    whole = query.copy()
    for key in ("node", "what"):
        whole.pop(key, None)
    unnarrowed = query.copy()
    for name in ("step", "error_type"):
        unnarrowed.pop(name, None)
    return {
        "form": form, "page": page, "agents": agents, "filters": filters,
        "query": query.urlencode(), "chips": pages.chip_links(page.chips, query),
        "columns": pages.sort_links(filters["sort"], query),
        "filtered": any(filters[k] for k in ("agent", "q", "created_after", "created_before",
                                             "node", "step", "error_type")),
        "stopped": stopped_words(filters["node"], filters["what"]),
        "unstopped": whole.urlencode(), "map_url": _map_url(filters["agent"], request),
        "narrowed": failure_words(filters["step"], filters["error_type"]),
        "unnarrowed": unnarrowed.urlencode(),
        # Batches (dashboard/batches.py): tick runs, or take every run of this filter.
        "can_operate": access.may(request.user, Ability.OPERATE),
        "filter_params": [(k, v) for k, values in query.lists() for v in values],
        "batch_actions": Batch.Action.choices,
        "saved_views": account_selectors.saved_views(user=request.user),
        "kept": kept(query), "export_limit": settings.STATEGUARD_RUNS_CSV_MAX_ROWS,
    }


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
        "resolve_form": ResolveForm(), "webhooks": webhooks.run_webhooks(run=run),
        "version": versions.of(run),
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


@login_required
def workers_page(request: HttpRequest) -> HttpResponse:
    """The workers, the queue and the runs per minute (monitoring.workers); no action. For
    those who see every run: it tells of everyone's."""
    access.check(request.user, Ability.VIEW)
    if not access.reads_all_runs(request.user):
        raise PermissionDenied("The workers page is for those who see every run.")

    def build() -> dict[str, Any]:
        snapshot = monitoring.snapshot()
        return {
            "state": snapshot.workers, "queue": snapshot.queue,
            "chart": chart.runs_per_minute(monitoring.throughput()),
            "capacity": sum(w.info.concurrency or 0 for w in snapshot.workers.alive),
            "alive_within": heartbeat.ALIVE_WITHIN,
            "poll_ms": round(settings.STATEGUARD_WORKERS_POLL_SECONDS * 1000),
        }
    return live.page(request, "dashboard/workers.html", build,
                     regions=["dashboard/live/workers.html"])


# -- actions ------------------------------------------------------------------------------

def _act(request: HttpRequest, run: Run, act: Callable[[], Any],
         done: str | Callable[[Any], str]) -> HttpResponse:
    """Call ``act``; the page says ``done`` (or what ``done`` makes of what ``act`` returned),
    or the service's refusal."""
    try:
        result = act()
    except services.ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, done if isinstance(done, str) else done(result))
    return redirect("dashboard:run", code=run.code)


def _invalid(request: HttpRequest, run: Run, why: str) -> HttpResponse:
    """A form that does not say what the action needs: the run's page again, with why."""
    messages.error(request, why)
    return redirect("dashboard:run", code=run.code)


def _decide(request: HttpRequest, code: uuid.UUID, decide: Callable[..., Run],
            verb: str, then: str) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _invalid(request, run, "Choose an approval to decide.")
    try:
        approval = selectors.approval_get(run=run, pk=form.cleaned_data["approval"])
    except selectors.NotFound as exc:
        return _invalid(request, run, str(exc))

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
def run_terminate(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    """Stop the run now; its confirmation chose what then: unwind it, or hold it. A pending
    run no worker took is settled at once, and the message says so."""
    run = _run_for(request, code, Ability.OPERATE)
    form = TerminateForm(request.POST)
    if not form.is_valid():
        return _invalid(request, run, "Choose what happens once the run stopped: unwind it, "
                        "or hold it." if "then" in form.errors else
                        "The reason is longer than 2000 characters.")
    then = form.cleaned_data["then"]

    def done(after: Run) -> str:
        if after.status in (Run.Status.PENDING, Run.Status.RUNNING):  # a worker stops it
            return ("Terminate requested: the worker stops the run at its next step, then "
                    + ("unwinds it, newest step first." if then == "unwind" else
                       "holds it for you."))
        return ("Terminated before it started: nothing ran, nothing is undone." if
                then == "unwind" else "Terminated before it started: it waits for you, "
                "needing attention.")

    return _act(request, run,
                lambda: services.run_terminate(run=run, by=services.Actor(request.user),
                                               then=then, reason=form.cleaned_data["reason"]),
                done)


@login_required
@require_POST
def run_resolve(request: HttpRequest, code: uuid.UUID) -> HttpResponse:
    run = _run_for(request, code, Ability.OPERATE)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return _invalid(request, run, "Say what was done by hand: the note is required.")
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
