"""The LangGraph internals ``stateguard.tools`` and the Send-task state rely on, checked against the
pinned versions: if an upgrade moves one, this fails by name instead of a refund going missing."""

from __future__ import annotations

from importlib.metadata import version

from langchain_core.tools import tool
from langgraph._internal._constants import CONFIG_KEY_READ_STATE
from langgraph.prebuilt import ToolNode

from stateguard.instrument import _READ_STATE_KEY
from stateguard.tools import install


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def test_it_runs_on_the_versions_it_was_checked_with() -> None:
    # Checked: langgraph 1.2.24, langgraph-prebuilt 1.1.3 (docs/core.md, "Agents with tools").
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


def test_it_reads_a_send_tasks_state_through_the_key_langgraph_sets() -> None:
    assert _READ_STATE_KEY == CONFIG_KEY_READ_STATE
