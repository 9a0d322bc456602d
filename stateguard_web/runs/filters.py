"""The runs list's parameters, read in one place: the dashboard's list, its CSV export and
``GET /api/runs`` take the same query string, so a list an operator looks at, the file they
export of it and what a script reads of the API are the same runs in the same order.

``RunFilterForm(query).filters()`` gives ``selectors.run_list``'s keyword arguments (and the
page's number); ``problems()`` says what was wrong with the parameters it had to ignore, in
words a person reads ("Status: Select a valid choice…"): the list shows them, the export and
the API refuse the request with them.
"""

from __future__ import annotations

import zoneinfo
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils import timezone

from stateguard_web.runs.agent_map import STOPS
from stateguard_web.sagas.models import Run

RANGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7),
          "30d": timedelta(days=30)}

# The list's orders: a column, "-" first for its largest (or newest) first. "-created" is the
# default. Each is read along an index on a large table (selectors.run_order says which).
SORT_COLUMNS = ("created", "updated", "duration", "agent", "status")
SORTS = tuple(s for column in SORT_COLUMNS for s in (f"-{column}", column))
DEFAULT_SORT = "-created"

# The page's "created" choices: the windows above, or two days of the browser's time zone.
RANGE_CHOICES = [("", "any time"), ("1h", "in the last hour"), ("24h", "in the last 24 hours"),
                 ("7d", "in the last 7 days"), ("30d", "in the last 30 days"),
                 ("custom", "between…")]

# The parameters the list keeps in its URL (the page's number aside): a saved view stores
# these, and nothing else.
PARAMETERS = ("status", "agent", "q", "range", "after", "before", "tz", "created_after",
              "created_before", "node", "what", "step", "error_type", "sort")
_CUSTOM = frozenset({"after", "before", "tz"})


class _Statuses(forms.MultipleChoiceField):
    """Any of several statuses; an empty one is none (``?status=``: the "All" chip's link as
    it was before several could be chosen, in bookmarks)."""

    def to_python(self, value: Any) -> list[str]:
        return [v for v in super().to_python(value) if v]


class RunFilterForm(forms.Form):
    """The runs list's query string. ``status`` may be given several times (any of them)."""

    status = _Statuses(required=False, choices=Run.Status.choices)
    agent = forms.CharField(required=False, max_length=100)
    q = forms.CharField(required=False, max_length=200, label="Search",
                        help_text="A run id (its first characters will do) or text in its input")
    range = forms.ChoiceField(required=False, label="Created", choices=RANGE_CHOICES)
    after = forms.DateField(required=False, label="from",
                            widget=forms.DateInput(attrs={"type": "date"}))
    before = forms.DateField(required=False, label="to (inclusive)",
                             widget=forms.DateInput(attrs={"type": "date"}))
    # The API's bounds (ISO 8601, UTC without an offset); with a range, both apply.
    created_after = forms.DateTimeField(required=False, label="Created after")
    created_before = forms.DateTimeField(required=False, label="Created before")
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
    tz = forms.CharField(required=False, max_length=64, label="Time zone",
                         widget=forms.HiddenInput)
    sort = forms.ChoiceField(required=False, label="Sort", choices=[(s, s) for s in SORTS])
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000,
                              widget=forms.HiddenInput)

    def clean_tz(self) -> str:
        name: str = self.cleaned_data.get("tz") or ""
        try:
            if name:
                zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise forms.ValidationError(f"{name!r} is not a time zone (Europe/Paris, UTC)."
                                        ) from None
        return name

    def clean_before(self) -> date | None:
        day: date | None = self.cleaned_data.get("before")
        if day is not None and day >= date.max:  # the range ends as the next day starts
            raise forms.ValidationError("Choose a day before 9999-12-31.")
        return day

    def filters(self) -> dict[str, Any]:
        """``selectors.run_list``'s keyword arguments (with ``page``) from the valid fields;
        an invalid one is left out (``problems()`` says why)."""
        self.is_valid()
        data = self.cleaned_data
        after, before = data.get("created_after"), data.get("created_before")
        if data.get("range") in RANGES:
            after = _later(after, timezone.now() - RANGES[data["range"]])
        elif data.get("range") == "custom":
            zone = _zone(data.get("tz") or "")
            if data.get("after"):
                after = _later(after, _start_of(data["after"], zone))
            if data.get("before"):
                end = _start_of(data["before"] + timedelta(days=1), zone)
                before = end if before is None else min(before, end)
        return {"status": list(data.get("status") or []), "agent": data.get("agent") or "",
                "q": data.get("q") or "", "created_after": after, "created_before": before,
                "node": data.get("node") or "", "what": data.get("what") or "",
                "step": data.get("step") or "", "error_type": data.get("error_type") or "",
                "sort": data.get("sort") or DEFAULT_SORT, "page": data.get("page") or 1}

    def problems(self) -> list[str]:
        """What was wrong, one sentence per parameter: "Status: Select a valid choice. bogus
        is not one of the available choices." ([] when every parameter is right)."""
        self.is_valid()
        return [f"{_capital(self.fields[name].label or name)}: {' '.join(errors)}"
                for name, errors in self.errors.items()]


def _capital(words: str) -> str:
    return words[:1].upper() + words[1:]


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else max(a, b)


def _zone(name: str) -> tzinfo:
    return zoneinfo.ZoneInfo(name) if name else timezone.get_current_timezone()


def _start_of(day: date, zone: tzinfo) -> datetime:
    return datetime.combine(day, time.min, tzinfo=zone)


def kept(query: QueryDict) -> str:
    """``query`` (a ``QueryDict``) as a saved view keeps it: the list's parameters alone, in
    their order, empty ones left out, and the days of a custom range only with one."""
    from django.http import QueryDict

    out = QueryDict(mutable=True)
    custom = query.get("range") == "custom"
    for name in PARAMETERS:
        if name in _CUSTOM and not custom:  # the page's script fills tz in on every page
            continue
        values = [v for v in query.getlist(name) if v]
        if values:
            out.setlist(name, values)
    return out.urlencode()
