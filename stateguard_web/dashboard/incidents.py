"""The Incidents page: failed and needs-attention runs grouped by agent, step and error type
(``runs.incidents``), each group a link to its runs (the runs list, filtered to it) and, for an
operator, to a batch over them: the existing batch confirmation (``batches``), given the group's
filter, with its preview, skips and audit. Thin, like ``views``: parse, authorize, read one page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.safestring import SafeString

from stateguard import lifecycle
from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.batches.worker import CHECKS
from stateguard_web.dashboard import errors, live, sparkline
from stateguard_web.runs import incidents, runtime
from stateguard_web.sagas.models import Batch, Run

# The batch actions a group offers, the first that fits its status the main one.
ORDER = (Batch.Action.RETRY, Batch.Action.RETRY_COMPENSATIONS, Batch.Action.COMPENSATE)
VERB = {Batch.Action.RETRY: "Retry", Batch.Action.RETRY_COMPENSATIONS:
        "Retry the compensations of", Batch.Action.COMPENSATE: "Compensate"}


WINDOW_WORDS = {"24h": "last 24 hours", "7d": "last 7 days", "30d": "last 30 days"}


class IncidentFilterForm(forms.Form):
    """GET parameters of the page; an invalid one is ignored (the default is shown)."""

    window = forms.ChoiceField(required=False, choices=list(WINDOW_WORDS.items()))
    status = forms.ChoiceField(required=False, choices=[
        ("", "failed or needing attention"),
        *[(s, Run.Status(s).label.lower()) for s in incidents.STATUSES]])
    agent = forms.CharField(required=False, max_length=100)
    sort = forms.ChoiceField(required=False, choices=[("count", "most runs first"),
                                                      ("recent", "latest first")])

    def filters(self) -> dict[str, str]:
        self.is_valid()
        data = self.cleaned_data  # the valid fields
        return {"window": data.get("window") or "24h", "status": data.get("status") or "",
                "agent": data.get("agent") or "", "sort": data.get("sort") or "count"}


def failure_words(step: str, error_type: str) -> str:
    """Where and how runs failed, as a phrase: "at charge_user with APIConnectionError"."""
    none = incidents.NONE
    at = "at no step on record" if step == none else f"at {step}" if step else ""
    with_ = ("with no error type on record" if error_type == none
             else f"with {error_type}" if error_type else "")
    return " ".join(p for p in (at, with_) if p)


@dataclass(frozen=True, slots=True)
class BatchLink:
    action: Batch.Action
    words: str  # "Retry 37 runs…"
    url: str


@dataclass(frozen=True, slots=True)
class GroupView:
    group: incidents.IncidentGroup
    where: str  # "at charge_user"
    runs_url: str
    summary: str  # the newest run's error in words
    spark: SafeString
    batches: list[BatchLink]


def _batches(group: incidents.IncidentGroup) -> list[BatchLink]:
    """The batch actions that fit the group's status, each a link to the confirmation of a
    batch over the group's filter (``batches.batch_new``, which counts the runs anew)."""
    runs = f"{group.count} run{'s' if group.count != 1 else ''}"
    confirm = reverse("dashboard:batch_new")
    return [BatchLink(action, f"{VERB[action]} {runs}…", confirm + "?" + urlencode(
                {"action": action.value, "scope": "filter", **group.filters}))
            for action in ORDER if lifecycle.refusal(CHECKS[action], group.status) is None]


def _said(group: incidents.IncidentGroup) -> str:
    """The newest run's error in words, less its type when the card shows it already."""
    said = errors.summary({"type": group.error_type, "message": group.sample})
    return said.removeprefix(f"{group.error_type}: ") if group.error_type else said


def _view(group: incidents.IncidentGroup, page: incidents.IncidentPage, runs_url: str,
          operate: bool) -> GroupView:
    return GroupView(
        group, failure_words(group.filters["step"], ""),
        runs_url + "?" + urlencode(group.filters), _said(group),
        sparkline.render(group.bars, start=page.start, width=page.bar_width,
                         what="runs got here"),
        _batches(group) if operate else [])


@login_required
def incident_list(request: HttpRequest) -> HttpResponse:
    access.check(request.user, Ability.VIEW)
    form = IncidentFilterForm(request.GET)
    filters = form.filters()
    return live.page(request, "dashboard/incidents.html",
                     lambda: _context(request, form, filters),
                     regions=["dashboard/live/incidents.html"])


def _context(request: HttpRequest, form: IncidentFilterForm,
             filters: dict[str, Any]) -> dict[str, Any]:
    page = incidents.incident_groups(runs=access.visible_runs(request.user),
                                     window=filters["window"], agent=filters["agent"] or None,
                                     status=filters["status"] or None, sort=filters["sort"])
    operate = access.may(request.user, Ability.OPERATE)
    agents = runtime.agent_names()
    if filters["agent"] and filters["agent"] not in agents:
        agents = [*agents, filters["agent"]]
    choices = {name: getattr(form.fields[name], "choices", []) for name in form.fields}
    return {
        "form": form, "filters": filters, "page": page,
        # The filter form's selects: name, label, choices, the value chosen.
        "selects": [("window", "Bars over the", choices["window"], filters["window"]),
                    ("status", "Status", choices["status"], filters["status"]),
                    ("agent", "Agent", [("", "every agent"), *((a, a) for a in agents)],
                     filters["agent"]),
                    ("sort", "Order", choices["sort"], filters["sort"])],
        "groups": [_view(group, page, reverse("dashboard:runs"), operate)
                   for group in page.groups],
        "window_words": WINDOW_WORDS[filters["window"]],
        "filtered": bool(filters["agent"] or filters["status"]),
    }
