"""A turn that ends on a tool call the model wrote but no one could read.

A chat model's client parses each tool call's arguments; when they are not valid JSON (a real
model does this now and then), LangChain keeps the call in ``AIMessage.invalid_tool_calls``,
not in ``tool_calls``, and ``create_react_agent`` (like any agent routing on ``tool_calls``)
ends the turn: no tool runs and LangGraph calls the run done. Over a charge whose booking the
model was just asking for, that is a silent success. So the end of a turn is judged like a tool
error the model could not be told of, by the guard's ``on_tool_error`` policy for that tool:
``"compensate"`` unwinds the turn, ``"model"`` lets it end, ``"auto"`` unwinds when the tool
has a compensation or the turn already has an effect to undo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage

from stateguard.effects import EffectLedger
from stateguard.exceptions import InvariantViolation
from stateguard.journal import turn_steps
from stateguard.records import EFFECT_STATUSES

if TYPE_CHECKING:
    from stateguard.core import GuardCore

# The name the built-in end-of-turn rule goes by in errors, the journal and the dashboard.
MALFORMED_TOOL_CALL = "stateguard:tool_calls_parse"


def tool_error_unwinds(core: GuardCore, run_id: str, tool: str, tags: tuple[str, ...] = (),
                       step_id: str | None = None) -> bool:
    """Whether a failed call of ``tool`` unwinds the run (``on_tool_error``; ``step_id``: the
    call's own step, whose recorded effects count)."""
    spec = core.spec
    policy = spec.tool_error_policy(tool, tags)
    if policy != "auto":
        return policy == "compensate"
    if spec.compensation_for(tool, tags) is not None:
        return True
    journal = core.journal
    if step_id is not None and isinstance(journal, EffectLedger) and any(
            e.step_id == step_id for e in journal.effects(run_id)):
        return True
    # This turn's effects only: an earlier turn of the conversation is settled.
    return any(s.status in EFFECT_STATUSES and spec.compensation_for(s.node, s.tags)
               for s in turn_steps(journal, run_id))


def malformed_call_violation(core: GuardCore, run_id: str, values: Any
                             ) -> InvariantViolation | None:
    """The violation a finished turn's final state shows, if its last message is a model's
    tool call that could not be parsed and that ``on_tool_error`` does not let pass."""
    messages = values.get("messages") if isinstance(values, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, AIMessage):
        return None
    for bad in last.invalid_tool_calls:
        tool = str(bad.get("name") or "")
        if tool_error_unwinds(core, run_id, tool):
            error = str(bad.get("error") or "its arguments are not valid JSON").split("\n")[0]
            return InvariantViolation(
                MALFORMED_TOOL_CALL,
                f"the model's last message asks for {tool or 'a tool'!r} ({bad.get('id')}) "
                f"but the call could not be parsed, so no tool ran: {error}",
                phase="at the end")
    return None
