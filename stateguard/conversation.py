"""After an unwind, answer the tool calls the model is still waiting for.

A chat agent (a model node beside a ``ToolNode``, or ``create_react_agent``) keeps one thread per
conversation, one turn per user message. When a turn fails in its tool calls and is unwound, the
model's last message asked for calls that no ``ToolMessage`` answers (the failed call, and the
calls that ran in the same task, whose writes LangGraph dropped with the failure), and
LangGraph's agent refuses such a history on the thread's next turn (``INVALID_CHAT_HISTORY``).
So after the unwind the guard answers each unanswered call with a ``ToolMessage(status="error")``
saying that the turn failed and what was undone, written as the ``ToolNode``'s update
(LangGraph's ``bulk_update_state``), and clears the tasks left: the thread's next turn starts
from the user's next message, as after any finished turn. A call that succeeded in a task of its
own (``create_react_agent`` v2 sends each call as one) keeps its answer; the failed call's
answer names what was undone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.types import StateUpdate

from stateguard.instrument import wrapped_node
from stateguard.report import UnwindReport
from stateguard.state import state_values
from stateguard.tool_calls import tool_calls
from stateguard.unwind import Cause

logger = logging.getLogger("stateguard")


def _tool_nodes(graph: Pregel[Any, Any, Any, Any]) -> Iterator[tuple[str, str]]:
    """(node name, messages key) of each ``ToolNode`` of the graph."""
    for name, node in graph.nodes.items():
        inner = wrapped_node(node.bound) or node.bound
        if isinstance(inner, ToolNode):
            yield name, str(getattr(inner, "_messages_key", "messages"))


def _why(cause: Cause, report: UnwindReport) -> str:
    if cause.invariant is not None:
        failed = f"invariant {cause.invariant.name!r} broke: {cause.invariant.message}"
    elif cause.error is not None:
        failed = str(cause.error)
    else:
        failed = {"operator": "an operator compensated it",
                  "crash": "its process stopped"}.get(cause.reason, cause.reason)
    if report.held:  # past the pivot: nothing was rolled back
        return f"Not done: this turn failed ({failed}); nothing was undone: {report.held}."
    undone = report.compensated
    return (f"Not done: this turn failed ({failed}) and was rolled back"
            + (f"; undone: {', '.join(undone)}" if undone else "") + ".")


def _answers(graph: Pregel[Any, Any, Any, Any], values: Any, text: str
             ) -> list[list[StateUpdate]] | None:
    """The updates that answer every unanswered tool call, or ``None`` when there is none."""
    if not isinstance(values, dict):
        return None
    for node, key in _tool_nodes(graph):
        waiting = [c for c in tool_calls(values, messages_key=key) if c.status == "requested"]
        if waiting:
            answers = [ToolMessage(content=text, tool_call_id=c.id, name=c.name,
                                   status="error") for c in waiting]
            # The state read holds the writes of the calls that succeeded beside the failed
            # one (pending on the checkpoint): the first update commits them, as LangGraph's
            # "clear the tasks" update does; the last clears the task the answers schedule.
            return [[StateUpdate(None, END)], [StateUpdate({key: answers}, node)],
                    [StateUpdate(None, END)]]
    return None


def _latest(config: RunnableConfig) -> RunnableConfig:
    """The thread's latest checkpoint (after time travel, the head of the new branch)."""
    return {"configurable": {"thread_id": config["configurable"]["thread_id"],
                             "checkpoint_ns": ""}}


def answer_tool_calls(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, cause: Cause,
                      report: UnwindReport) -> None:
    """Answer the calls left waiting by the unwound turn (see the module's docstring). A
    failure here is logged: the unwind it follows is done whatever happens to the history."""
    try:
        latest = _latest(config)
        updates = _answers(graph, state_values(graph.get_state(latest).values),
                           _why(cause, report))
        if updates is not None:
            graph.bulk_update_state(latest, updates)
    except Exception:
        logger.warning("answering the tool calls left waiting in run %s failed",
                       report.run_id, exc_info=True)


async def aanswer_tool_calls(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                             cause: Cause, report: UnwindReport) -> None:
    try:
        latest = _latest(config)
        updates = _answers(graph, state_values((await graph.aget_state(latest)).values),
                           _why(cause, report))
        if updates is not None:
            await graph.abulk_update_state(latest, updates)
    except Exception:
        logger.warning("answering the tool calls left waiting in run %s failed",
                       report.run_id, exc_info=True)
