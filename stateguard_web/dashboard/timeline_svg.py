"""A run's timeline (``runs.timeline``) as an SVG strip, drawn on the server like the graph.

Time runs left to right on one linear scale from the run's submission, so the longest bars are
where the time went (an approval that waited an hour dwarfs the steps, as it should); each
group of bars (the model's turns, steps, tool calls, approvals, compensations) has its lanes,
so what ran at once is stacked. Every bar is a link to its row on the page (a step's or a
compensation's ``<details>``), with a ``<title>`` and an ``aria-label`` that say its name,
status and duration in words; its name is written in it when it fits, else beside it when the
lane has room, else only in its title. A compensation's attempts are a strip along its
bottom, the gaps between them its back-off. Bars that are not over are dashed.

Plain markup, no inline style or script (the CSP forbids them): positions are SVG attributes,
colours the status classes of dashboard.css. The picture has a fixed width; its panel scrolls
sideways on a narrow screen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from html import escape  # Django's, less its lazy-string wrapper: called for every bar

from django.utils.safestring import SafeString, mark_safe

from stateguard_web.dashboard import labels
from stateguard_web.dashboard.hidden import marked
from stateguard_web.runs.timeline import GROUPS, IN_DOUBT, Bar, Timeline

WIDTH = 860  # the run page's main column at 1280 px
_PAD_L, _PAD_R = 6, 16
_AXIS_H, _HEAD_H, _LANE_H, _BAR_H = 24, 17, 24, 18
_CHAR_W = 6.7  # a character's width at the bars' font size (monospace, 11 px)
_MIN_W = 3.0  # the narrowest bar drawn (a step of a few ms in a run of minutes)
_NICE = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120,
         300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_KINDS = {"model": "Model's turn", "step": "Step", "tool_call": "Tool call",
          "approval": "Wait for the approval of", "compensation": "Undo of"}
# How each group's time is called in the summary above the picture.
_SPENT = {"model": "the model", "steps": "steps", "tools": "tool calls",
          "approvals": "waiting for approval", "compensations": "compensating"}


@dataclass(frozen=True, slots=True)
class Scale:
    start: datetime
    seconds: float  # the whole width
    per_second: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_second",
                           (WIDTH - _PAD_L - _PAD_R) / max(self.seconds, 1e-3))

    def x(self, at: datetime) -> float:
        return _PAD_L + (at - self.start).total_seconds() * self.per_second


def ticks(seconds: float, most: int = 8) -> list[tuple[float, str]]:
    """Round times along an axis of ``seconds``, at most ``most`` + 1 of them from 0, in
    words of one unit (the one that suits the last): "0", "500 ms", ... or "0", "1 min"."""
    step = next((s for s in _NICE if seconds / s <= most), _NICE[-1])
    times = [round(i * step, 6) for i in range(int(seconds / step + 1e-9) + 1)]
    last = times[-1]
    size, unit = ((0.001, "ms") if last < 1 else (1, "s") if last < 120 or step < 60
                  else (60, "min") if last < 7200 or step < 3600 else (3600, "h"))
    return [(t, f"{round(t / size, 6):g} {unit}" if t else "0") for t in times]


def _status_label(bar: Bar) -> labels.Label:
    kind = {"compensation": "compensation", "approval": "approval"}.get(bar.kind, "step")
    return labels.label(kind, bar.status)


def describe(bar: Bar) -> str:
    """The bar in words: its title and its label for screen readers."""
    words = _status_label(bar).words
    took = labels.seconds_words(bar.seconds)
    if bar.status == IN_DOUBT:
        time = f"started, never finished (cut off within {took})"
    elif bar.open:
        time = f"{took} so far"
    else:
        time = f"took {took}"
    text = f"{_KINDS[bar.kind]} {bar.name}: {words}, {time}"
    return text + (f". {bar.detail}" if bar.detail else "")


def _fit(text: str, room: float) -> str:
    """``text`` cut to ``room`` pixels ("charge_ca…"); "" when not even a few letters fit."""
    chars = int(room / _CHAR_W)
    if len(text) <= chars:
        return text
    return text[:chars - 1] + "…" if chars >= 4 else ""


def _bar_label(bar: Bar, x: float, w: float, room_after: float) -> tuple[str, float, bool]:
    """What to write for ``bar`` and where: inside it, else after it (``room_after`` pixels
    free in its lane), else nothing."""
    name = marked(bar.name)
    took = "" if bar.open else labels.seconds_words(bar.seconds)
    full = f"{name} · {took}" if took else name
    for text in (full, name):
        if len(text) * _CHAR_W <= w - 8:
            return text, x + 4, False
    if len(full) * _CHAR_W <= room_after - 8:
        return full, x + w + 4, True
    inside = _fit(name, w - 8)
    if inside:
        return inside, x + 4, False
    return _fit(name, room_after - 8), x + w + 4, True


def _attempts(bar: Bar, scale: Scale, y: float) -> list[str]:
    parts = []
    for attempt in bar.attempts:
        ax = scale.x(attempt.start)
        aw = max(scale.x(attempt.end) - ax, 2.0)
        outcome = "ok" if attempt.ok else "failed"
        took = labels.seconds_words((attempt.end - attempt.start).total_seconds())
        tip = f"Attempt {attempt.number}: {outcome}, took {took}" + (
            f". {attempt.summary}" if attempt.summary else "")
        parts.append(
            f'<g class="tl-attempt st-{"ok" if attempt.ok else "bad"}" '
            f'data-attempt="{attempt.number}" data-ok="{str(attempt.ok).lower()}">'
            f'<title>{escape(marked(tip))}</title><rect x="{ax:.1f}" y="{y + _BAR_H - 4:.1f}" '
            f'width="{aw:.1f}" height="4"/></g>')
    return parts


def _bar(bar: Bar, scale: Scale, y: float, room_after: float) -> str:
    x = scale.x(bar.start)
    w = max(scale.x(bar.end) - x, _MIN_W)
    href = {"compensation": f"#comp-{bar.pk}", "approval": "#approvals-h"}.get(
        bar.kind, f"#step-{bar.pk}")
    css = f"tl-bar tl-{bar.kind} st-{_status_label(bar).css}" + (" tl-open" if bar.open else "")
    said = escape(marked(describe(bar)))
    text, tx, outside = _bar_label(bar, x, w, room_after)
    label = (f'<text class="tl-label{" tl-outside" if outside else ""}" x="{tx:.1f}" '
             f'y="{y + 12:.1f}">{escape(text)}</text>' if text else "")
    return (f'<a class="{css}" href="{href}" data-kind="{bar.kind}" '
            f'data-name="{escape(marked(bar.name))}" data-status="{escape(bar.status)}" '
            f'data-group="{bar.group}" data-lane="{bar.lane}" '
            f'data-ms="{bar.seconds * 1000:.0f}" aria-label="{said}">'
            f'<title>{said}</title><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
            f'height="{_BAR_H}" rx="3"/>{"".join(_attempts(bar, scale, y))}{label}</a>')


def _rooms(bars: list[Bar], scale: Scale) -> dict[int, float]:
    """Per bar (by id): the pixels free after it in its lane, up to the next bar or the edge."""
    rooms: dict[int, float] = {}
    lanes: dict[tuple[str, int], list[Bar]] = {}
    for bar in bars:
        lanes.setdefault((bar.group, bar.lane), []).append(bar)
    for lane in lanes.values():
        lane.sort(key=lambda b: b.start)
        for bar, after in zip(lane, [*lane[1:], None], strict=True):
            end = scale.x(after.start) if after else WIDTH
            x = scale.x(bar.start)
            rooms[id(bar)] = end - x - max(scale.x(bar.end) - x, _MIN_W)
    return rooms


def summary(line: Timeline) -> str:
    """Where the time went, in words, for the sentence above the picture."""
    parts = [f"queued {labels.seconds_words(line.queued)}"] if line.queued >= 0.001 else []
    parts += [f"{_SPENT[g]} {labels.seconds_words(s)}" for g, s in line.totals.items()]
    until = "until now" if line.ticking else "in all"
    return f"{labels.seconds_words(line.seconds)} {until}" + (
        f": {', '.join(parts)}" if parts else "")


def height(line: Timeline) -> int:
    return _AXIS_H + sum(_HEAD_H + n * _LANE_H for n in line.lanes.values()) + 6


def render(line: Timeline, *, title: str) -> SafeString:
    """The picture. Every name and detail is escaped, its hidden characters marked: node
    names come from agent code, tool names and what a model said from a model, errors and
    reasons from anywhere."""
    scale = Scale(line.start, line.seconds)
    tall = height(line)
    parts = [f'<svg class="tl" viewBox="0 0 {WIDTH} {tall}" width="{WIDTH}" height="{tall}" '
             f'role="group" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    for at, words in ticks(line.seconds):
        x = scale.x(line.start) + at * scale.per_second
        anchor = "start" if at == 0 else "end" if x > WIDTH - 30 else "middle"
        parts.append(f'<line class="tl-grid" x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS_H - 6}" '
                     f'y2="{tall - 4}"/><text class="tl-tick" x="{x:.1f}" y="{_AXIS_H - 10}" '
                     f'text-anchor="{anchor}">{words}</text>')
    if line.ticking:
        x = scale.x(line.end)
        parts.append(f'<line class="tl-now" x1="{x:.1f}" x2="{x:.1f}" y1="{_AXIS_H - 6}" '
                     f'y2="{tall - 4}"/>')
    rooms = _rooms(line.bars, scale)
    y = float(_AXIS_H)
    for group, count in line.lanes.items():
        head = GROUPS[group] + f" · {labels.seconds_words(line.totals.get(group, 0.0))}"
        if count > 1 and group in ("steps", "tools"):
            head += f" · up to {count} at once"
        parts.append(f'<text class="tl-group" x="{_PAD_L}" y="{y + 12:.1f}" '
                     f'data-group="{group}">{escape(head)}</text>')
        y += _HEAD_H
        for bar in (b for b in line.bars if b.group == group):
            parts.append(_bar(bar, scale, y + bar.lane * _LANE_H + 2, rooms[id(bar)]))
        y += count * _LANE_H
    parts.append("</svg>")
    return mark_safe("".join(parts))
