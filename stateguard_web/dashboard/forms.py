"""The dashboard's forms: the runs list's filters, and what each action takes."""

from __future__ import annotations

import zoneinfo
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from django import forms
from django.utils import timezone

from stateguard_web.dashboard.pages import RANGES
from stateguard_web.runs.agent_map import STOPS
from stateguard_web.sagas.models import Run

MAX_ID = 2**63 - 1


class RunFilterForm(forms.Form):
    """GET parameters of the runs list. An invalid one is shown with its error and ignored;
    the others still filter."""

    status = forms.ChoiceField(required=False, choices=[("", "All"), *Run.Status.choices])
    agent = forms.CharField(required=False, max_length=100)
    q = forms.CharField(required=False, max_length=200, label="Search",
                        help_text="A run id (its first characters will do) or text in its input")
    range = forms.ChoiceField(required=False, label="Created", choices=[
        ("", "any time"), ("1h", "in the last hour"), ("24h", "in the last 24 hours"),
        ("7d", "in the last 7 days"), ("30d", "in the last 30 days"), ("custom", "between…")])
    after = forms.DateField(required=False, label="from",
                            widget=forms.DateInput(attrs={"type": "date"}))
    before = forms.DateField(required=False, label="to (inclusive)",
                             widget=forms.DateInput(attrs={"type": "date"}))
    # Where the runs stand or stopped, as an agent's map counts them (runs/agent_map.py): set
    # by a click on the map, shown as what the list is narrowed to, kept by the filter form.
    node = forms.CharField(required=False, max_length=200, label="Stopped at")
    what = forms.ChoiceField(required=False, label="as", choices=[
        ("", "any"), *((key, stop.words) for key, stop in STOPS.items())])
    # Where the run last failed and with what: an Incidents group's runs (incidents.py). Set
    # by the group's link, shown as what the list is narrowed to, kept by the filter form.
    step = forms.CharField(required=False, max_length=200, label="Failed at")
    error_type = forms.CharField(required=False, max_length=200, label="Error type")
    # The browser's time zone (the page's script fills it in), for the days of a custom range.
    tz = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000,
                              widget=forms.HiddenInput)

    def filters(self) -> dict[str, Any]:
        """Keyword arguments for ``pages.run_list_page`` from the valid fields."""
        self.is_valid()
        data = self.cleaned_data
        after, before = None, None
        if data.get("range") in RANGES:
            after = timezone.now() - RANGES[data["range"]]
        elif data.get("range") == "custom":
            zone = _zone(data.get("tz") or "")
            if data.get("after"):
                after = _start_of(data["after"], zone)
            if data.get("before"):
                before = _start_of(data["before"] + timedelta(days=1), zone)
        return {"status": data.get("status") or "", "agent": data.get("agent") or "",
                "q": data.get("q") or "", "created_after": after, "created_before": before,
                "node": data.get("node") or "", "what": data.get("what") or "",
                "step": data.get("step") or "", "error_type": data.get("error_type") or "",
                "page": data.get("page") or 1}


def _zone(name: str) -> tzinfo:
    try:
        return zoneinfo.ZoneInfo(name) if name else timezone.get_current_timezone()
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return timezone.get_current_timezone()


def _start_of(day: date, zone: tzinfo) -> datetime:
    return datetime.combine(day, time.min, tzinfo=zone)


class _Reason(forms.Form):
    reason = forms.CharField(required=False, max_length=2000, strip=True,
                             widget=forms.Textarea(attrs={"rows": 2}))


class DecisionForm(_Reason):
    """Approve or reject: the approval the operator was shown (deciding any other is refused)."""

    approval = forms.IntegerField(min_value=1, max_value=MAX_ID, widget=forms.HiddenInput)


class CompensateForm(_Reason):
    pass


class TerminateForm(_Reason):
    """Terminate: what happens once the run stopped (the service checks it against the run)."""

    then = forms.ChoiceField(choices=[("unwind", "Unwind it"), ("hold", "Hold it")],
                             widget=forms.RadioSelect)


class RetryFromForm(forms.Form):
    """Retry from an earlier step: the step the operator was shown, and an optional update of
    the agent's state (a JSON object), set before the step runs again."""

    step = forms.CharField(max_length=300, widget=forms.HiddenInput)
    update = forms.JSONField(
        required=False, label="Update of the state (JSON, optional)",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"key": "value"}'}),
        help_text="Values set in the agent's state before the step runs again.")

    def clean_update(self) -> dict[str, object] | None:
        update = self.cleaned_data.get("update")
        if update in (None, ""):
            return None
        if not isinstance(update, dict):
            raise forms.ValidationError("Give a JSON object of the state's keys.")
        return update


class ResolveForm(forms.Form):
    note = forms.CharField(max_length=2000, strip=True, label="What was done by hand",
                           widget=forms.Textarea(attrs={"rows": 3}))
