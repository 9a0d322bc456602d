"""A sparkline: counts over time as a small bar chart, an SVG drawn on the server.

Plain markup, as the agent's graph (``graph``): no script draws it, a live re-read of the page
redraws it like any other part, and the Content-Security-Policy (no inline style) holds: the
bars' geometry is in SVG attributes, their colours in dashboard.css (``.spark-*``). Each bar
has a title (its time span and count) for a pointer, and the picture an ``aria-label`` that
says it in words for a screen reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

BAR, GAP, HEIGHT = 4, 1, 24  # a bar's width and the space after it; the picture's height


def _at(moment: datetime, width: timedelta) -> str:
    """A bar's start, in UTC (the markup's time zone: ``<time>`` elements are UTC too)."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%b %d %H:%M UTC") if width < timedelta(days=1) else \
        utc.strftime("%b %d")


def render(bars: Sequence[int], *, start: datetime, width: timedelta, what: str) -> SafeString:
    """``bars`` (counts, oldest first, each over ``width`` from ``start``) as an SVG.
    ``what`` names the counts, for the label ("runs failed")."""
    peak = max(bars, default=0)
    total = sum(bars)
    if peak:
        busiest = bars.index(peak)
        said = (f"{total} {what} in this window; the most, {peak}, from "
                f"{_at(start + busiest * width, width)}")
    else:
        said = f"no {what} in this window"
    step = BAR + GAP
    parts = [f'<svg class="spark" viewBox="0 0 {len(bars) * step} {HEIGHT}" '
             f'width="{len(bars) * step}" height="{HEIGHT}" role="img" '
             f'aria-label="{escape(said)}" xmlns="http://www.w3.org/2000/svg">',
             f'<line class="spark-base" x1="0" y1="{HEIGHT - 0.5}" x2="{len(bars) * step}" '
             f'y2="{HEIGHT - 0.5}"/>']
    for i, count in enumerate(bars):
        if not count:
            continue
        height = max(2, round(count / peak * (HEIGHT - 2)))
        tip = f"{_at(start + i * width, width)}: {count}"
        parts.append(f'<rect class="spark-bar{" spark-peak" if count == peak else ""}" '
                     f'x="{i * step}" y="{HEIGHT - height}" width="{BAR}" height="{height}">'
                     f"<title>{escape(tip)}</title></rect>")
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it is escaped
