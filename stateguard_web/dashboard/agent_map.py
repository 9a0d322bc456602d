"""An agent's map: its graph as the run page draws it (``graph.py``), each node with the runs
of a time window that are now at it, wait for approval at it, failed at it or were compensated
after it (``runs.agent_map`` counts them), coloured by the share of the window's runs that
failed there. An AI agent's tools are drawn under its ``tools`` node: each call is a step of
its own in the journal.

A click on a node opens the runs list narrowed to the runs stopped there (``node``, and
``what`` for one count of it), created in the same window. The colour is never the only sign:
each node says its counts and its share in words (and the table under the picture, which is
what a phone reads). Live like the runs list: re-read on the runs' events, at most every
``LIVE_EVERY_MS`` (a map counts thousands of runs: it need not move with each step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.dashboard import graph, labels, live
from stateguard_web.runs import agent_map, runtime, versions
from stateguard_web.runs.agent_map import STOPS, WINDOWS, MapNode

LIVE_EVERY_MS = 2000


@dataclass(frozen=True, slots=True)
class Band:
    """A colour of the map: the nodes whose failure share is below ``below``."""

    css: str
    words: str
    below: float


# By the share of the window's runs that failed at (or were compensated after) a node.
BANDS = (
    Band("idle", "no run failed here", 0.0),  # exactly none
    Band("wait", "under 1 % of the runs failed here", 0.01),
    Band("warn", "1 % to 10 %", 0.10),
    Band("bad", "10 % or more", float("inf")),
)
# Each count's sign on a node (its words are in the legend, the tooltip and the table).
SIGNS = {"now": labels.LABELS["run"]["running"].symbol,
         "waiting": labels.LABELS["run"]["paused"].symbol,
         "failed": labels.LABELS["run"]["failed"].symbol,
         "compensated": labels.LABELS["run"]["compensated"].symbol}

# The table's column of each count (its words: STOPS).
HEADINGS = {"now": "Now", "waiting": "Waiting", "failed": "Failed",
            "compensated": "Compensated"}


def band(node: MapNode) -> Band:
    if not node.counts.failures:
        return BANDS[0]
    return next(b for b in BANDS[1:] if node.share < b.below)


def percent(node: MapNode) -> str:
    """The node's failure share ("4.2 %"); "" with no failure."""
    if not node.counts.failures:
        return ""
    share = node.share * 100
    return f"{'< 0.1' if share < 0.1 else f'{share:.1f}'} %"


def share_words(node: MapNode) -> str:
    return f"{percent(node)} failed here" if node.counts.failures else "no failure"


def counts_words(node: MapNode) -> str:
    """The node's counts, each after its sign ("● 2  ✕ 3"); what a box has room for."""
    shown = [f"{SIGNS[what]} {node.counts.of(what)}" for what in STOPS if node.counts.of(what)]
    return "  ".join(shown) or "no run stopped here"


def runs_url(agent: str, node: str, window: str, what: str = "") -> str:
    """The runs list narrowed to the runs a count is of: same agent, node, window."""
    query = {"agent": agent, "node": node, "range": window, **({"what": what} if what else {})}
    return f"{reverse('dashboard:runs')}?{urlencode(query)}"


@dataclass(frozen=True, slots=True)
class Row:
    """A node as the table under the picture shows it."""

    node: MapNode
    band: Band
    share: str  # in words
    percent: str
    href: str
    counts: list[tuple[str, str, int, str]]  # (what, heading, count, its runs' URL)


def map_page(*, user: Any, agent: str, window: str) -> dict[str, Any]:
    found = agent_map.agent_map(runs=access.visible_runs(user), agent=agent, window=window,
                                now=timezone.now())
    nodes = agent_map.map_nodes(found)
    rows = [Row(n, band(n), share_words(n), percent(n), runs_url(agent, n.name, window),
                [(w, HEADINGS[w], n.counts.of(w), runs_url(agent, n.name, window, w))
                 for w in STOPS])
            for n in nodes]
    states = {r.node.name: graph.NodeState(
        r.band.css, counts_words(r.node), current=r.node.counts.now > 0,
        note=_note(r.node), detail=r.share, href=r.href) for r in rows}
    lay = graph.map_layout(agent, tuple((n.parent, n.name) for n in nodes if n.parent))
    svg: SafeString = graph.render(lay, states, title=f"Map of the {agent} agent")
    return {"map": found, "rows": rows, "svg": svg, "window_words": WINDOWS[window][0],
            "versions": versions.live_counts(access.visible_runs(user), agent=agent)}


def _note(node: MapNode) -> str:
    """The counts in words: the node's tooltip and its link's name."""
    said = [f"{node.counts.of(w)} {STOPS[w].words}" for w in STOPS if node.counts.of(w)]
    tool = f"A tool of the {node.parent} node. " if node.parent else ""
    return tool + (", ".join(said) if said else "No run stands or stopped here") + (
        ". Opens these runs.")


@login_required
@require_GET
def agent_map_view(request: HttpRequest, name: str) -> HttpResponse:
    access.check(request.user, Ability.VIEW)
    agents = runtime.agent_names()
    if name not in agents:
        raise Http404(f"no agent {name!r}: this deployment offers {', '.join(agents)}")
    window = request.GET.get("window") or agent_map.DEFAULT_WINDOW
    context: dict[str, Any] = {"agent": name, "agents": agents, "windows": WINDOWS,
                               "window": window, "bands": BANDS,
                               "columns": [(HEADINGS[w], s.words) for w, s in STOPS.items()],
                               "signs": [(SIGNS[w], s.words) for w, s in STOPS.items()],
                               "live_every": LIVE_EVERY_MS}
    if window not in WINDOWS:
        context["error"] = (f"There is no window {window[:20]!r}: choose the last hour (1h), "
                            "day (24h) or 7 days (7d).")
        return render(request, "dashboard/agent_map.html", context, status=400)

    def build() -> dict[str, Any]:
        return {**context, **map_page(user=request.user, agent=name, window=window),
                "reads_all": access.reads_all_runs(request.user)}
    return live.page(request, "dashboard/agent_map.html", build,
                     regions=["dashboard/live/agent_map.html"])


@login_required
@require_GET
def agent_maps(request: HttpRequest) -> HttpResponse:
    """The navigation's "Map": the first agent's (the page offers the others)."""
    access.check(request.user, Ability.VIEW)
    agents = runtime.agent_names()
    if not agents:
        raise Http404("this deployment offers no agent")
    return redirect("dashboard:agent_map", name=agents[0])
