"""The ``shop`` agent of tests/web/test_versions.py, in two versions: v2 adds a node. A worker
process that names this module in ``STATEGUARD_AGENTS`` registers what
``STATEGUARD_TEST_SHOP`` says, as a deploy would: ``1``, ``2``, or ``2+1`` (v2, with v1 kept
for draining). Imported with neither, it registers nothing (the test process registers its
own)."""

from __future__ import annotations

import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from agents.registry import AgentInput, AgentSettings, AgentSpec, register


class Order(AgentInput):
    amount: int


class State(TypedDict, total=False):
    amount: int
    done: list[str]


def node(name: str) -> Any:
    def run(state: State) -> State:
        return {"done": [*state.get("done", []), name]}
    return run


def undo(state: dict[str, Any], ctx: Any) -> bool:
    return True


def factory(*nodes: str) -> Any:
    """An agent whose nodes run one after the other, its ``charge`` behind an approval."""
    def build() -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(State)
        for name in nodes:
            builder.add_node(name, node(name))
        for a, b in zip([START, *nodes], [*nodes, END], strict=True):
            builder.add_edge(a, b)
        return builder

    def spec(settings: AgentSettings) -> AgentSpec:
        return AgentSpec(name="shop", build=build, input_schema=Order,
                         compensations={name: undo for name in nodes},
                         approvals={"charge": lambda s: True})
    return spec


V1 = factory("reserve", "charge")
V2 = factory("reserve", "charge", "ship")


_DEPLOYS = {"1": [("1", V1, False)], "2": [("2", V2, False)],
            "2+1": [("2", V2, False), ("1", V1, True)]}
for _version, _factory, _draining in _DEPLOYS.get(os.environ.get("STATEGUARD_TEST_SHOP", ""),
                                                   []):
    register("shop", version=_version, draining=_draining)(_factory)
