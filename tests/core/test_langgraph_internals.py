"""The LangGraph internals StateGuard relies on (docs/internals.md), checked against the pinned
versions: if an upgrade moves one, this fails by name instead of a refund going missing."""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version
from typing import Any

import langgraph.pregel._loop
import pytest
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tools import tool
from langgraph._internal._constants import (
    CONFIG_KEY_CALL,
    CONFIG_KEY_CHECKPOINTER,
    CONFIG_KEY_READ_STATE,
    CONFIG_KEY_TASK_ID,
)
from langgraph._internal._runnable import RunnableCallable
from langgraph.func import entrypoint, task
from langgraph.prebuilt import ToolNode
from langgraph.pregel._loop import AsyncPregelLoop, SyncPregelLoop

from stateguard import ConfigurationError
from stateguard import plain_runs as plain_runs_module
from stateguard.functional import CALL_KEY, tasks_of
from stateguard.instrument import _READ_STATE_KEY, _TASK_ID_KEY
from stateguard.tools import install
from tests.core.support import config, line_builder
from tests.core.test_plain_runs import NODES, make


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def test_it_runs_on_the_versions_it_was_checked_with() -> None:
    # Checked: langgraph 1.2.24, langgraph-prebuilt 1.1.3; pyproject.toml pins the series.
    assert version("langgraph").startswith("1.2.")
    assert version("langgraph-prebuilt").startswith("1.1.")


def test_it_finds_where_toolnode_keeps_its_wrappers_and_body() -> None:
    def mine(request: object, execute: object) -> object:
        raise AssertionError("not called here")

    node = ToolNode([noop], wrap_tool_call=mine)  # type: ignore[arg-type]
    assert node._wrap_tool_call is mine and node._awrap_tool_call is None
    assert node.func is not None and node.afunc is not None
    assert node._messages_key == "messages"

    install(node, {})

    # composed: the user's wrapper still runs inside StateGuard's
    assert node._wrap_tool_call.args == (mine,)  # type: ignore[union-attr]
    assert node._awrap_tool_call is None  # a sync wrapper alone keeps serving async runs


def test_it_reads_the_config_keys_langgraph_sets_for_a_task() -> None:
    assert _READ_STATE_KEY == CONFIG_KEY_READ_STATE  # a Send task's graph state
    assert _TASK_ID_KEY == CONFIG_KEY_TASK_ID  # a step's id
    assert CONFIG_KEY_CHECKPOINTER == "__pregel_checkpointer"  # stateguard.tools finds the guard


def test_it_hands_task_calls_where_langgraph_looks_for_them() -> None:
    # @task's __call__ hands each call to config["configurable"][CONFIG_KEY_CALL], read from
    # the runnable context (get_config(): langchain-core's var_child_runnable_config), with
    # the task's function first: stateguard.functional wraps that function there.
    assert CALL_KEY == CONFIG_KEY_CALL
    seen: list[Any] = []

    @task
    def charge_card(amount: int) -> int:
        return amount

    token = var_child_runnable_config.set(
        {"callbacks": None,
         "configurable": {CALL_KEY: lambda func, input, **kw: seen.append((func, input))}})
    try:
        charge_card(5)
    finally:
        var_child_runnable_config.reset(token)
    assert seen == [(charge_card.func, ((5,), {}))]


def test_it_finds_the_tasks_a_node_function_calls() -> None:
    # The node's body is RunnableCallable.func (an @entrypoint's too); @task's type is found
    # through the public decorator.
    @task
    def charge_card(amount: int) -> int:
        return amount

    @entrypoint()
    def trip(amount: int) -> int:
        return charge_card(amount).result()

    assert tasks_of({"trip": trip.nodes["trip"].bound}) == {"charge_card": ("stateguard:task",)}


def test_it_wraps_a_node_in_langgraphs_own_runnable() -> None:
    # RunnableCallable(func, afunc, name=, trace=, recurse=): sync and async in one runnable,
    # with no trace of its own; stateguard.instrument builds each node wrapper so.
    runnable = RunnableCallable(lambda s: s, None, name="n", trace=False, recurse=False)
    assert runnable.invoke({"x": 1}) == {"x": 1} and runnable.name == "n"


def test_it_finds_langgraphs_loop_for_every_kind_of_run() -> None:
    found: list[Any] = []
    original = plain_runs_module.PlainRuns._begin

    def begin(self: Any, graph: Any, loop: Any, run_id: str, saved: Any) -> None:
        found.append(loop)
        assert {"stack", "durability", "input", "config"} <= set(vars(loop))
        original(self, graph, loop, run_id, saved)

    effects: list[str] = []
    graph = line_builder(NODES, effects).compile(checkpointer=make(effects))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plain_runs_module.PlainRuns, "_begin", begin)
        graph.invoke({}, config("s"))
        list(graph.stream({}, config("st")))
        asyncio.run(graph.ainvoke({}, config("a")))
    assert [type(loop) for loop in found] == [SyncPregelLoop, SyncPregelLoop, AsyncPregelLoop]
    assert [loop.status for loop in found] == ["done"] * 3  # what the turn's end reads


@pytest.mark.parametrize("moved", ["module", "class", "stack"])
def test_it_refuses_to_run_when_langgraphs_loop_moved(moved: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A later LangGraph may rename the private module, the loop class or its exit stack: then
    # a plain run cannot be settled, so it must not start (the runner still works).
    if moved == "module":
        monkeypatch.setitem(sys.modules, "langgraph.pregel._loop", None)  # import fails
    elif moved == "class":
        monkeypatch.delattr(langgraph.pregel._loop, "PregelLoop")
    else:
        monkeypatch.setattr(plain_runs_module, "_starting_run",
                            lambda frame: (object.__new__(type(graph)), object()))
    effects: list[str] = []
    guard = make(effects)
    graph = line_builder(NODES, effects).compile(checkpointer=guard)
    with pytest.raises(ConfigurationError, match="LangGraph version"):
        graph.invoke({}, config("moved"))
    assert effects == []
    if moved != "stack":
        guard.invoke(graph, {}, config("runner"))
        assert effects == NODES
