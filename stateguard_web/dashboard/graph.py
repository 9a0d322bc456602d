"""The agent's graph as an SVG picture, drawn on the server.

LangGraph describes a compiled graph's nodes and edges (``get_graph()``, the same data its
``draw_mermaid()`` prints). Drawing it here instead of with a JavaScript Mermaid renderer keeps
the page free of a 3 MB library, and the picture is plain markup: each node is a ``<g>`` whose
class and label say its step's status, so a live re-read of the page redraws it like any other
part. Layout: nodes in layers top to bottom by their longest path from ``__start__`` (edges
back to an earlier layer, a loop, are drawn as curves on the right), in the order the agent
added them within a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from stateguard_web.dashboard import labels
from stateguard_web.runs import runtime

START, END = "__start__", "__end__"
_ROW, _GAP, _BOX_H, _PAD = 78, 24, 46, 16
_MAP_BOX_H = 62
_CHAR_W = 7.4  # a node name's width per character at the picture's font size
_STATUS_CHAR_W = 6.6  # the same for the smaller status line


@dataclass(frozen=True, slots=True)
class Box:
    node: str
    x: float  # left
    y: float  # top
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


@dataclass(frozen=True, slots=True)
class Layout:
    boxes: dict[str, Box]
    edges: tuple[tuple[str, str, bool], ...]  # source, target, conditional
    width: float
    height: float
    # Steps drawn under the node they run in (an agent's map: the tool calls under ``tools``):
    # (node, step), joined by a dotted line, not an edge of the graph.
    under: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the picture says about one node: a CSS class (its colour) and the words, and
    what they mean when the words alone may puzzle (the node's tooltip)."""

    css: str
    label: str
    current: bool = False
    note: str = ""
    detail: str = ""  # a third line, in a taller box (an agent's map: the failure share)
    href: str = ""  # where a click on the node goes (an agent's map: the runs stopped there)


_not_run = labels.LABELS["graph"]["not_run"]
NOT_RUN = NodeState(_not_run.css, _not_run.words)


def agent_layout(agent: str) -> Layout | None:
    """The layout of ``agent``'s graph; ``None`` for an agent this deployment does not offer."""
    try:
        runtime.agent_spec(agent)
    except KeyError:
        return None
    return _layout(agent)


@cache  # an agent's graph does not change while the process runs
def _layout(agent: str) -> Layout:
    graph = runtime.agent_spec(agent).build().compile().get_graph()
    nodes = list(graph.nodes)
    edges = tuple((e.source, e.target, bool(e.conditional)) for e in graph.edges)
    return layout(nodes, edges)


@lru_cache(maxsize=64)  # per agent, and the tools its journal names besides its registry's
def map_layout(agent: str, under: tuple[tuple[str, str], ...]) -> Layout:
    """``agent``'s graph as its map draws it: taller boxes (a third line), and each step of
    ``under`` (node, step: a tool and its tools node) drawn in the row below its node."""
    graph = runtime.agent_spec(agent).build().compile().get_graph()
    edges = tuple((e.source, e.target, bool(e.conditional)) for e in graph.edges)
    return layout([*graph.nodes, *(step for _, step in under)], edges, under=under,
                  box_h=_MAP_BOX_H)


def layout(nodes: list[str], edges: tuple[tuple[str, str, bool], ...], *,
           under: tuple[tuple[str, str], ...] = (), box_h: float = _BOX_H) -> Layout:
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for source, target, _ in edges:
        out.setdefault(source, []).append(target)
    for node, step in under:  # placed as a node's successors are: the row below it
        out.setdefault(node, []).append(step)
    back = _back_edges(nodes, out)
    layer = {n: 0 for n in nodes}
    # Longest path on the graph without its back edges (a DAG): relax in topological order.
    for node in _topological(nodes, out, back):
        for target in out.get(node, []):
            if (node, target) not in back:
                layer[target] = max(layer[target], layer[node] + 1)
    rows: dict[int, list[str]] = {}
    for node in nodes:
        rows.setdefault(layer[node], []).append(node)
    widths = {n: _box_width(n) for n in nodes}
    row_widths = {r: sum(widths[n] for n in ns) + _GAP * (len(ns) - 1) for r, ns in rows.items()}
    width = max(row_widths.values(), default=0) + 2 * _PAD + 40  # room for loops on the right
    boxes = {}
    row = box_h + _ROW - _BOX_H
    for r, ns in rows.items():
        x = (width - 40 - row_widths[r]) / 2
        for n in ns:
            h = 30 if n in (START, END) else box_h
            boxes[n] = Box(n, x, _PAD + r * row + (box_h - h) / 2, widths[n], h)
            x += widths[n] + _GAP
    height = _PAD * 2 + (max(rows, default=0)) * row + box_h
    return Layout(boxes, edges, width, height, under)


def _box_width(node: str) -> float:
    if node in (START, END):
        return 64
    return max(170.0, min(len(node), 26) * _CHAR_W + 28)  # 170: "▶ awaiting approval"


def _back_edges(nodes: list[str], out: dict[str, list[str]]) -> set[tuple[str, str]]:
    """Edges that close a loop, found by a depth-first walk from ``__start__``."""
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done

    def walk(node: str) -> None:
        state[node] = 1
        for target in out.get(node, []):
            if state.get(target) == 1:
                back.add((node, target))
            elif target not in state:
                walk(target)
        state[node] = 2

    for root in ([START] if START in out else []) + nodes:
        if root not in state:
            walk(root)
    return back


def _topological(nodes: list[str], out: dict[str, list[str]],
                 back: set[tuple[str, str]]) -> list[str]:
    indegree = {n: 0 for n in nodes}
    for source, targets in out.items():
        for target in targets:
            if (source, target) not in back and target in indegree:
                indegree[target] += 1
    ready = [n for n in nodes if indegree[n] == 0]
    order = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for target in out.get(node, []):
            if (node, target) not in back and target in indegree:
                indegree[target] -= 1
                if indegree[target] == 0:
                    ready.append(target)
    return order


def _fit(words: str, room: float) -> str:
    """Squeeze a status longer than its box ("compensation failed · attempt 3") into it."""
    return (f' textLength="{room:.0f}" lengthAdjust="spacingAndGlyphs"'
            if len(words) * _STATUS_CHAR_W > room else "")


def _label(node: str) -> str:
    return node if len(node) <= 26 else node[:25] + "…"


def render(lay: Layout, states: dict[str, NodeState], *, title: str) -> SafeString:
    """The picture: ``states`` gives each node that has one its class and words (the others
    are drawn "not run"). Every name is escaped: node names come from agent code."""
    parts = [
        f'<svg class="graph" viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" '
        f'width="{lay.width:.0f}" height="{lay.height:.0f}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'class="graph-arrow"/></marker></defs>',
    ]
    for source, target, conditional in lay.edges:
        a, b = lay.boxes.get(source), lay.boxes.get(target)
        if a is None or b is None:
            continue
        dash = ' stroke-dasharray="5 4"' if conditional else ""
        if b.y > a.y:
            path = f"M{a.cx:.1f},{a.y + a.h:.1f} L{b.cx:.1f},{b.y - 2:.1f}"
        else:  # a loop back up: around the right-hand side
            right = max(a.x + a.w, b.x + b.w) + 30
            path = (f"M{a.x + a.w:.1f},{a.y + a.h / 2:.1f} C{right:.1f},{a.y + a.h / 2:.1f} "
                    f"{right:.1f},{b.y + b.h / 2:.1f} {b.x + b.w + 2:.1f},{b.y + b.h / 2:.1f}")
        parts.append(f'<path class="graph-edge" d="{path}"{dash} marker-end="url(#arrow)"/>')
    for node, step in lay.under:
        a, b = lay.boxes[node], lay.boxes[step]
        parts.append(f'<path class="graph-under" d="M{a.cx:.1f},{a.y + a.h:.1f} '
                     f'L{b.cx:.1f},{b.y:.1f}"/>')
    steps_under = {step for _, step in lay.under}
    for node, box in lay.boxes.items():
        if node in (START, END):
            parts.append(
                f'<g class="graph-node graph-terminal"><rect x="{box.x:.1f}" y="{box.y:.1f}" '
                f'width="{box.w:.0f}" height="{box.h:.0f}" rx="15"/><text x="{box.cx:.1f}" '
                f'y="{box.y + box.h / 2 + 4:.1f}" text-anchor="middle">'
                f'{"start" if node == START else "end"}</text></g>')
            continue
        parts.append(_node(node, box, states.get(node, NOT_RUN), node in steps_under))
    parts.append("</svg>")
    return mark_safe("".join(parts))


def _node(node: str, box: Box, state: NodeState, under: bool) -> str:
    css = (f"graph-node st-{state.css}" + (" graph-current" if state.current else "")
           + (" graph-step-under" if under else ""))
    words = ("▶ " if state.current else "") + state.label
    tip = f"{node}: {words}" + (f", {state.detail}" if state.detail else "") + (
        f". {state.note}" if state.note else "")
    lines = [(words, "graph-status", 36)] + (
        [(state.detail, "graph-detail", 53)] if state.detail else [])
    texts = "".join(
        f'<text class="{cls}" x="{box.cx:.1f}" y="{box.y + dy:.1f}" text-anchor="middle"'
        f'{_fit(text, box.w - 14)}>{escape(text)}</text>' for text, cls, dy in lines)
    shape = (f'<title>{escape(tip)}</title><rect x="{box.x:.1f}" y="{box.y:.1f}" '
             f'width="{box.w:.0f}" height="{box.h:.0f}" rx="8"/><text class="graph-name" '
             f'x="{box.cx:.1f}" y="{box.y + 19:.1f}" text-anchor="middle">'
             f'{escape(_label(node))}</text>{texts}')
    if state.href:  # the whole box is the link, named by its words for a screen reader
        shape = (f'<a href="{escape(state.href)}" aria-label="{escape(tip)}">{shape}</a>')
    return f'<g class="{css}" data-node="{escape(node)}">{shape}</g>'
