"""The workers page's chart of runs per minute, drawn on the server as SVG: one polyline per
series, no script and no chart library (the page's CSP allows neither inline scripts nor
styles; the lines' colours are classes in workers.css).

The SVG is stretched to the box the page gives it (``preserveAspectRatio="none"``: a fixed
height, the page's width) and its strokes keep their width whatever the stretch
(``vector-effect``); the axes' labels are HTML around it, so they stay readable at 1280 and at
390 px alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from stateguard_web.monitoring.workers import SERIES, Throughput

WIDTH, HEIGHT = 1000, 200  # the plot, in the SVG's units
PAD = 6  # above and below it, so that lines at 0 and at the top are not cut in half
LABELS = {"submitted": "submitted", "started": "started", "succeeded": "succeeded",
          "compensated": "compensated", "needs_attention": "needing attention"}
QUARTERS = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the time axis is labelled


@dataclass(frozen=True)
class Line:
    name: str  # the series (its CSS class is "line-<name>")
    label: str
    points: str  # "x,y x,y ..." for <polyline points>
    total: int
    peak: int


@dataclass(frozen=True)
class Chart:
    view_box: str
    lines: list[Line]
    grid: list[float]  # the y of each horizontal line: the top, the middle, 0
    y_labels: list[str]  # the same lines' values, top first
    x_labels: list[str]  # at QUARTERS of the width: minutes back, then "now"
    rows: list[tuple[str, list[int]]]  # per minute: "HH:MM" (UTC) and the counts, newest first
    empty: bool  # nothing at all in the window


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at or above ``value``: the axis's top."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def runs_per_minute(rate: Throughput) -> Chart:
    n = len(rate.minutes)
    top = nice_ceiling(max((max(c, default=0) for c in rate.counts.values()), default=0) or 1)

    def x(i: int) -> float:
        return WIDTH * (i / (n - 1) if n > 1 else 1.0)

    def y(value: float) -> float:
        return HEIGHT * (1 - value / top)

    lines = [Line(name, LABELS[name],
                  " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(rate.counts[name])),
                  sum(rate.counts[name]), max(rate.counts[name], default=0))
             for name in SERIES]
    marks = [top, top // 2, 0] if top % 2 == 0 else [top, 0]  # whole runs only
    x_labels = [f"\N{MINUS SIGN}{round((n - 1) * (1 - f))} min" if f < 1 else "now"
                for f in QUARTERS]
    rows = [(minute.strftime("%H:%M"), [rate.counts[name][i] for name in SERIES])
            for i, minute in reversed(list(enumerate(rate.minutes)))]
    return Chart(f"0 {-PAD} {WIDTH} {HEIGHT + 2 * PAD}", lines, [y(m) for m in marks],
                 [str(m) for m in marks], x_labels, rows,
                 all(line.total == 0 for line in lines))
