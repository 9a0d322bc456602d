"""Subgraphs: a compiled graph added as a node is one step to StateGuard.

Its inner nodes are not journaled one by one, so a compensation or approval cannot name one:
that is refused when the graph is validated, naming the subgraph to key it by instead. And when
a subgraph raises, some of its inner nodes may have had their effect before the one that failed:
its step is journaled with ``SUBGRAPH_TAG``, and the unwind treats it as in doubt (its
compensation runs when declared ``in_doubt_safe``, which checks what happened; otherwise the run
needs attention), never as a step that had no effect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.pregel import Pregel

from stateguard.exceptions import ConfigurationError
from stateguard.spec import GuardSpec

SUBGRAPH_TAG = "stateguard:subgraph"


def _inner_names(graph: Pregel[Any, Any, Any, Any], path: str) -> dict[str, str]:
    """Every node name and tag inside ``graph`` (and its own subgraphs) -> where it is."""
    found: dict[str, str] = {}
    for name, node in graph.nodes.items():
        if name.startswith("__"):
            continue
        where = f"{path}/{name}"
        found.setdefault(name, where)
        tags = (node.metadata or {}).get("tags", ())
        for tag in (tags,) if isinstance(tags, str) else tags:
            found.setdefault(str(tag), where)
        if isinstance(node.bound, Pregel):
            for inner, at in _inner_names(node.bound, where).items():
                found.setdefault(inner, at)
    return found


def mark_subgraphs(spec: GuardSpec, nodes: Mapping[str, Iterable[str]],
                   runnables: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """``nodes`` (name -> tags) with ``SUBGRAPH_TAG`` on the subgraph nodes; refuses a
    compensation or approval that names a node or tag only found inside a subgraph."""
    marked = {name: tuple(tags) for name, tags in nodes.items()}
    outer = set(marked) | {tag for tags in marked.values() for tag in tags}
    for name, runnable in runnables.items():
        if name not in marked or not isinstance(runnable, Pregel):
            continue
        marked[name] = (*marked[name], SUBGRAPH_TAG)
        inner = _inner_names(runnable, name)
        for kind, keys in (("compensation", spec.compensations), ("approval", spec.approvals)):
            for key in keys:
                if key in inner and key not in outer:
                    raise ConfigurationError(
                        f"the {kind} {key!r} names {inner[key]!r}, inside the subgraph "
                        f"{name!r}: StateGuard journals a subgraph as one step, so key it by "
                        f"{name!r} (or a tag on that node); if the subgraph raises, that "
                        "compensation runs only when declared in_doubt_safe")
    return marked
