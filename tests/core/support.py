"""Small graphs and recorders shared by the core tests."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from stateguard import CompensationRetry

FAST_RETRY = CompensationRetry(attempts=3, initial=0.001, cap=0.005)


class LineState(TypedDict, total=False):
    balance: int
    log: Annotated[list[str], operator.add]
    fail_at: str
    charge_id: str


def line_builder(nodes: list[str], effects: list[str],
                 bodies: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None
                 ) -> StateGraph[Any, Any, Any, Any]:
    """A linear graph; each node appends its name to ``effects`` (its "external effect") and to
    the state's log, and raises if the state's ``fail_at`` names it."""
    bodies = bodies or {}
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def make(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def node(state: dict[str, Any]) -> dict[str, Any]:
            if state.get("fail_at") == name:
                raise ValueError(f"{name} failed")
            effects.append(name)
            update = {"log": [name]}
            if name in bodies:
                update.update(bodies[name](state))
            return update
        node.__name__ = name
        return node

    for name in nodes:
        builder.add_node(name, make(name))
    for a, b in zip([START, *nodes], [*nodes, END], strict=True):
        builder.add_edge(a, b)
    return builder


def fork_builder(effects: list[str], sibling: str) -> StateGraph[Any, Any, Any, Any]:
    """``charge``, then in parallel ``sibling`` (which succeeds) and ``book`` (which raises)."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    for name in ("charge", sibling):
        builder.add_node(name, lambda s, name=name: effects.append(name) or {"log": [name]})

    def book(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("warehouse down")

    builder.add_node("book", book)
    builder.add_edge(START, "charge")
    for name in (sibling, "book"):
        builder.add_edge("charge", name)
        builder.add_edge(name, END)
    return builder


def undo(log: list[str], name: str, result: Any = True) -> Callable[..., Any]:
    def compensation(state: dict[str, Any], ctx: Any) -> Any:
        log.append(f"undo:{name}")
        return result
    compensation.__name__ = f"undo_{name}"
    return compensation


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}
