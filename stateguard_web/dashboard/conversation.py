"""An AI run's conversation, for its run page: what the model said and asked for, and each tool
call with its arguments and its answer, in the order they happened.

Read from the journal's steps alone (no checkpoint read): a model node's step journals the
model's message as its update (``{"messages": [<message as a dict>]}``), and every tool call
is a step of its own whose update is the call (``stateguard.tool_calls.ToolCall.as_update``).
So the conversation shows exactly what the saga did, including calls that failed, were left in
doubt by a dead worker, or were rewound.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stateguard.tool_calls import TOOL_TAG, ToolCall
from stateguard_web.runs.timeline import model_messages
from stateguard_web.sagas.models import Step

# How much of a long answer the page shows before "…" (the step's detail has all of it).
TEXT_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class Asked:
    name: str
    call_id: str
    args: str  # as JSON
    garbled: str = ""  # why the client could not read it (an invalid tool call)


@dataclass(frozen=True, slots=True)
class ModelTurn:
    step: Step
    text: str
    asked: tuple[Asked, ...]
    kind = "model"


@dataclass(frozen=True, slots=True)
class ToolTurn:
    step: Step
    name: str
    call_id: str
    args: str
    status: str  # success, error, or requested: no answer journaled (running, or in doubt)
    answer: str
    kind = "tool"


Turn = ModelTurn | ToolTurn


def _text(value: Any) -> str:
    if isinstance(value, list):  # content blocks: the text ones
        value = "\n".join(str(b.get("text", "")) if isinstance(b, Mapping) else str(b)
                          for b in value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…"


def _args(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args, sort_keys=True, default=str)


def _model_turn(step: Step, message: Mapping[str, Any]) -> ModelTurn:
    asked = [Asked(str(c.get("name", "")), str(c.get("id", "")), _args(c.get("args", {})))
             for c in message.get("tool_calls") or () if isinstance(c, Mapping)]
    asked += [Asked(str(c.get("name") or "?"), str(c.get("id") or ""), _text(c.get("args", "")),
                    garbled=str(c.get("error") or "not valid JSON").split("\n")[0])
              for c in message.get("invalid_tool_calls") or () if isinstance(c, Mapping)]
    return ModelTurn(step, _text(message.get("content", "")), tuple(asked))


def _tool_turn(step: Step) -> ToolTurn:
    call = ToolCall.from_update(step.update)
    if call is None:  # started, no outcome journaled: running now, or left in doubt
        return ToolTurn(step, step.node, step.step_id.rpartition(":")[2], "", "requested", "")
    answer = _text(call.content if call.content is not None else call.artifact)
    return ToolTurn(step, call.name or step.node, call.id, _args(call.args), call.status, answer)


def conversation(steps: list[Step]) -> list[Turn]:
    """The run's conversation, in step order (``steps`` oldest first); empty for a run with
    no tool call (not an AI run)."""
    turns: list[Turn] = []
    for step in steps:
        if TOOL_TAG in (step.tags or ()):
            turns.append(_tool_turn(step))
        else:
            turns.extend(_model_turn(step, m) for m in model_messages(step.update))
    return turns if any(isinstance(t, ToolTurn) or t.asked for t in turns) else []
