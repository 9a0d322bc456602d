"""stateguard.versions: a graph's shape, its digest and what changed between two."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph

from stateguard.versions import GraphShape


class State(TypedDict, total=False):
    n: int


def add_one(state: State) -> State:
    return {"n": state.get("n", 0) + 1}


def add_two(state: State) -> State:  # another body, same place in the graph
    return {"n": state.get("n", 0) + 2}


def build(*nodes: str, body: Any = add_one, branch: bool = False) -> Any:
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(State)
    for name in nodes:
        builder.add_node(name, body)
    for a, b in zip([START, *nodes], [*nodes, END], strict=True):
        if branch and a == nodes[0]:
            builder.add_conditional_edges(a, lambda s, to=b: to, [b, END])
        else:
            builder.add_edge(a, b)
    return builder.compile()


def test_it_gives_the_same_digest_for_the_same_graph_in_another_process() -> None:
    here = GraphShape.of(build("charge", "book")).digest
    code = ("from tests.core.test_versions import build; from stateguard.versions import "
            "GraphShape; print(GraphShape.of(build('charge', 'book')).digest)")
    # Another interpreter: another hash seed, other object ids, nodes made in another order.
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "12345"}).stdout.strip()
    assert there == here and len(here) == 16


def test_it_changes_the_digest_when_a_node_or_an_edge_changes_not_a_body() -> None:
    v1 = GraphShape.of(build("charge", "book"))

    assert GraphShape.of(build("charge", "book", body=add_two)) == v1  # the declared version's
    added = GraphShape.of(build("charge", "book", "ship"))
    renamed = GraphShape.of(build("charge", "reserve"))
    rewired = GraphShape.of(build("book", "charge"))  # same nodes, other edges
    branched = GraphShape.of(build("charge", "book", branch=True))
    digests = {s.digest for s in (v1, added, renamed, rewired, branched)}
    assert len(digests) == 5


def test_it_says_which_nodes_and_edges_were_added_and_removed() -> None:
    v1 = GraphShape.of(build("charge", "book"))

    assert GraphShape.of(build("charge", "ship")).changes_from(v1) == (
        "nodes added: ship; nodes removed: book; edges added: charge → ship, ship → __end__; "
        "edges removed: book → __end__, charge → book")
    assert v1.changes_from(v1) == ""
    assert GraphShape.of(build("charge", "book", branch=True)).changes_from(v1) == (
        "edges added: charge ⇢ __end__, charge ⇢ book; edges removed: charge → book")  # ⇢: if


def test_it_reads_back_a_stored_shape_in_any_order() -> None:
    shape = GraphShape.of(build("charge", "book"))
    stored = [list(reversed(shape.nodes)), [list(e) for e in reversed(shape.edges)]]  # JSON

    assert GraphShape.make(*stored) == shape


def test_it_draws_a_functional_entrypoint_as_one_node() -> None:
    @task
    def double(x: int) -> int:
        return 2 * x

    @entrypoint(checkpointer=InMemorySaver())
    def workflow(x: int) -> int:
        return double(x).result()

    assert GraphShape.of(workflow).nodes == ("__end__", "__start__", "workflow")
