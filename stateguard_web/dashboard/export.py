"""The runs list as a CSV file: the runs of its filters (``runs.filters``: the same query
string as the page and ``GET /api/runs``), in its order, the ones the user may see, at most
``STATEGUARD_RUNS_CSV_MAX_ROWS`` of them (``X-Truncated: true`` when there were more).

Streamed: rows are read through a server-side cursor a chunk at a time and written as they
come, so a large export holds one chunk in memory, not the file. Under ASGI (Daphne) the
chunks are read in the request's thread, one ``sync_to_async`` call each: Django would
otherwise read a synchronous iterator whole before sending its first byte.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.runs import selectors
from stateguard_web.runs.filters import RunFilterForm
from stateguard_web.sagas.models import Run

CHUNK = 500
HEADER = ("run", "status", "agent", "created_at", "updated_at", "started_at", "finished_at",
          "duration_seconds", "submitted_by", "failed_at", "error_type", "input")
STARTED, DURATION = HEADER.index("started_at"), HEADER.index("duration_seconds")
# A cell a spreadsheet would take for a formula ("=HYPERLINK(...)" in an agent's input):
# written with a leading apostrophe, as OWASP's CSV injection advice has it.
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return f"{value.total_seconds():.3f}"
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if isinstance(value, str) and value.startswith(_FORMULA):
        return f"'{value}"
    return "" if value is None else value


def _lines(runs: QuerySet[Run], limit: int) -> Iterator[str]:
    """The header, then the rows, a chunk of ``CHUNK`` rows per string."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(HEADER)
    username = f"submitted_by__{get_user_model().USERNAME_FIELD}"
    rows = runs.values_list("code", "status", "agent", "created_at", "updated_at",
                            "started_at", "finished_at", "duration", username, "failed_node",
                            "error_type", "input")[:limit].iterator(chunk_size=CHUNK)
    while True:
        chunk = list(islice(rows, CHUNK))
        # A run no worker took has no duration yet (run_duration says 0, to sort it).
        writer.writerows([_cell(None if i == DURATION and row[STARTED] is None else v)
                          for i, v in enumerate(row)] for row in chunk)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        if len(chunk) < CHUNK:
            return


async def _streamed(lines: Iterator[str]) -> AsyncIterator[str]:
    read = sync_to_async(lambda: next(lines, None), thread_sensitive=True)
    while (part := await read()) is not None:
        yield part


@login_required
@require_GET
def runs_csv(request: HttpRequest) -> HttpResponse:
    """The list's runs as CSV; a parameter the list would ignore is a 400 here, saying which
    (an export of other runs than asked would be wrong without anyone seeing it)."""
    access.check(request.user, Ability.VIEW)
    form = RunFilterForm(request.GET)
    problems = form.problems()
    if problems:
        return HttpResponse("\n".join(["The export's parameters are wrong:", *problems]) + "\n",
                            status=400, content_type="text/plain; charset=utf-8")
    filters = form.filters()
    filters.pop("page")
    limit = settings.STATEGUARD_RUNS_CSV_MAX_ROWS
    runs = selectors.run_list(runs=access.visible_runs(request.user), **filters)
    truncated = runs[limit:limit + 1].exists()
    lines = _lines(runs, limit)
    response = StreamingHttpResponse(
        _streamed(lines) if isinstance(request, ASGIRequest) else lines,
        content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="runs-{stamp}.csv"'
    response["X-Row-Limit"] = str(limit)
    response["X-Truncated"] = "true" if truncated else "false"
    response["Cache-Control"] = "no-store"
    return response
