"""An agent's version: the shape of its compiled graph, and what changed between two shapes.

A run resumed on a graph other than the one it started on can go wrong in ways no one sees: a
node it paused before is gone, an edge now leads elsewhere. The shape is what a worker compares
before it resumes a run: the graph's node names and edges (LangGraph's ``get_graph()``),
sorted, so the same graph gives the same digest in every process::

    from stateguard.versions import GraphShape

    shape = GraphShape.of(compiled)
    shape.digest                 # "3f9a0c1e5b7d2a64": stored with each run
    shape.changes_from(older)    # "nodes added: ship; edges added: charge → ship"

Only the structure counts: a change to a node's body (what it does) leaves the shape as it is.
That is what a version the agent declares (``register(..., version="4")``) is for. A
Functional API ``@entrypoint`` shows as one node (its tasks are not part of the drawing).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["GraphShape"]

Edge = tuple[str, str, bool]  # source, target, conditional


@dataclass(frozen=True, slots=True)
class GraphShape:
    """A graph's node names and edges (source, target, conditional), sorted."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]

    @classmethod
    def of(cls, graph: Any) -> GraphShape:
        """The shape of a compiled graph (anything with LangGraph's ``get_graph()``)."""
        drawn = graph.get_graph()
        return cls.make(drawn.nodes, [(e.source, e.target, bool(e.conditional))
                                      for e in drawn.edges])

    @classmethod
    def make(cls, nodes: Any, edges: Any) -> GraphShape:
        """A shape from node names and ``(source, target, conditional)`` triples (as stored:
        JSON gives lists), in any order."""
        return cls(tuple(sorted(str(n) for n in nodes)),
                   tuple(sorted((str(s), str(t), bool(c)) for s, t, c in edges)))

    @property
    def digest(self) -> str:
        """16 hex digits of SHA-256 over the sorted shape: the same in every process."""
        canonical = json.dumps([self.nodes, self.edges], separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def changes_from(self, old: GraphShape) -> str:
        """What changed from ``old`` to this shape, in words for an operator ("" if nothing)."""
        def edge(e: Edge) -> str:
            return f"{e[0]} {'⇢' if e[2] else '→'} {e[1]}"

        nodes = (("nodes added", [n for n in self.nodes if n not in old.nodes]),
                 ("nodes removed", [n for n in old.nodes if n not in self.nodes]))
        edges = (("edges added", [edge(e) for e in self.edges if e not in old.edges]),
                 ("edges removed", [edge(e) for e in old.edges if e not in self.edges]))
        return "; ".join(f"{what}: {', '.join(names)}" for what, names in (*nodes, *edges)
                         if names)
