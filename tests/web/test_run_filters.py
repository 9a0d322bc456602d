"""The runs list's parameters (runs.filters): one parser for the dashboard's list, its CSV
export and GET /api/runs. No database: the form reads a query string, nothing more."""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from django.http import QueryDict
from django.utils import timezone

from stateguard_web.api.schemas import CreatedRange, RunSort
from stateguard_web.runs.filters import DEFAULT_SORT, RANGES, SORTS, RunFilterForm, kept


def parsed(query: str) -> tuple[dict[str, typing.Any], list[str]]:
    form = RunFilterForm(QueryDict(query))
    return form.filters(), form.problems()


def test_it_reads_several_statuses_and_an_order() -> None:
    filters, problems = parsed("status=failed&status=needs_attention&sort=-duration&agent=x")
    assert problems == []
    assert filters["status"] == ["failed", "needs_attention"]
    assert filters["sort"] == "-duration" and filters["agent"] == "x"


def test_it_lists_newest_first_by_default() -> None:
    filters, problems = parsed("")
    assert problems == [] and filters["sort"] == DEFAULT_SORT == "-created"
    assert filters["status"] == [] and filters["page"] == 1
    filters, problems = parsed("status=&agent=x")  # "All", as its link was before
    assert problems == [] and filters["status"] == [] and filters["agent"] == "x"


def test_it_says_what_is_wrong_with_each_bad_parameter_and_ignores_it() -> None:
    filters, problems = parsed("status=failed&status=lost&sort=colour&tz=Mars/Olympus"
                               "&created_after=yesterday&page=0&agent=ok")
    assert [p.split(":")[0] for p in problems] == ["Status", "Created after", "Time zone",
                                                  "Sort", "Page"]
    assert "lost is not one of the available choices" in problems[0]
    assert "'Mars/Olympus' is not a time zone" in problems[2]
    assert filters["status"] == [] and filters["sort"] == "-created"
    assert filters["created_after"] is None and filters["agent"] == "ok"


def test_it_refuses_a_last_day_it_cannot_end() -> None:
    """The range's last day ends at the start of the next: there is none after 9999-12-31
    (it was an OverflowError: a 500)."""
    filters, problems = parsed("range=custom&before=9999-12-31&tz=UTC")
    assert problems and problems[0].startswith("To (inclusive):")
    assert filters["created_before"] is None


def test_it_takes_the_later_bound_of_a_range_and_the_apis_created_after() -> None:
    old = (timezone.now() - timedelta(days=20)).isoformat()
    filters, _ = parsed(f"range=7d&created_after={quote(old)}")
    assert timezone.now() - filters["created_after"] < timedelta(days=7, minutes=1)
    filters, _ = parsed("range=custom&after=2026-03-01&before=2026-03-02&tz=Europe/Paris"
                        "&created_before=2026-03-02T12:00:00Z")
    assert filters["created_after"] == datetime(2026, 2, 28, 23, tzinfo=UTC)
    assert filters["created_before"] == datetime(2026, 3, 2, 12, tzinfo=UTC)


def test_the_api_schema_lists_the_orders_and_ranges_the_parser_takes() -> None:
    assert set(typing.get_args(RunSort)) == set(SORTS)
    assert set(typing.get_args(CreatedRange)) == {*RANGES, "custom"}


def test_a_saved_view_keeps_the_lists_parameters_only() -> None:
    query = QueryDict("status=failed&status=paused&page=3&csrfmiddlewaretoken=x&agent="
                      "&sort=agent&colour=red&q=a%26b")
    assert kept(query) == "status=failed&status=paused&q=a%26b&sort=agent"
    # The days and time zone of a "between…" range only with one.
    assert kept(QueryDict("range=24h&tz=Europe/Paris&after=2026-01-01")) == "range=24h"
    assert kept(QueryDict("range=custom&tz=Europe/Paris&after=2026-01-01")) == (
        "range=custom&after=2026-01-01&tz=Europe%2FParis")
