"""Tool calls as StateGuard sees them: what a compensation is told about the call it undoes, and
a helper to write invariants over the calls an agent made.

An agent's external effects happen in its tool calls (``charge_card``, ``book_flight``), not in
its nodes (``agent``, ``tools``). Each call is journaled as a step of its own (see
``stateguard.tools``); its compensation gets ``ctx.tool_call``::

    def refund(state, ctx):
        charge = ctx.tool_call.result          # the tool's artifact, or its JSON content
        stripe.Refund.create(charge=charge["charge_id"], idempotency_key=ctx.idempotency_key)
        return True

Invariants read the calls from the conversation with ``tool_calls(state)``::

    def within_budget(state):
        return sum(c.args["amount"] for c in tool_calls(state, "charge_card")) <= 500_00

Calls the model asked for count before they run (``status == "requested"``), so an invariant
like this one stops the run when the model *proposes* an over-budget charge, before any tool
runs. Pass ``status="success"`` to count only calls that returned.

Nothing here imports LangGraph: messages are read by duck typing (LangChain's ``AIMessage`` and
``ToolMessage``, or their dict forms).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["TOOL_TAG", "ToolCall", "tool_call_of", "tool_calls"]

# Tag on every tool-call step, so a journal's reader (and the unwind) can tell a tool call
# from a node. Namespaced: a user's compensation would not be keyed by it by accident.
TOOL_TAG = "stateguard:tool_call"

ToolCallStatus = Literal["requested", "success", "error"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call: what the model asked for and, once it ran, what the tool answered.

    ``content`` is the ``ToolMessage``'s content (a tool returning a dict has it serialised as
    JSON text), ``artifact`` what a ``response_format="content_and_artifact"`` tool returned
    beside it. ``result`` is the artifact when there is one, else the content parsed as JSON
    when it parses, else the content. ``command`` is set when the tool answered with a
    LangGraph ``Command``: its update, goto and graph in plain form (``stateguard.tools``), so
    that the call is replayed as that ``Command``."""

    id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    status: ToolCallStatus = "requested"
    content: Any = None
    artifact: Any = None
    command: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def result(self) -> Any:
        if self.artifact is not None:
            return self.artifact
        if isinstance(self.content, str):
            try:
                return json.loads(self.content)
            except ValueError:
                return self.content
        return self.content

    def as_update(self) -> dict[str, Any]:
        """How a journal stores the call (the step's ``update``): plain, JSON-friendly keys."""
        update = {"tool_call_id": self.id, "tool": self.name, "args": self.args,
                  "status": self.status, "content": self.content, "artifact": self.artifact}
        if self.command is not None:
            update["command"] = self.command
        return update

    @classmethod
    def from_update(cls, update: Any) -> ToolCall | None:
        """The call a tool step journaled (``as_update``), or ``None`` for another step."""
        if not isinstance(update, Mapping) or "tool_call_id" not in update:
            return None
        status = update.get("status")
        command = update.get("command")
        return cls(str(update["tool_call_id"]), str(update.get("tool", "")),
                   dict(update.get("args") or {}),
                   status if status in ("requested", "success", "error") else "success",
                   update.get("content"), update.get("artifact"),
                   dict(command) if isinstance(command, Mapping) else None)


def _get(message: Any, key: str, default: Any = None) -> Any:
    if isinstance(message, Mapping):
        return message.get(key, default)
    return getattr(message, key, default)


def tool_calls(state: Mapping[str, Any], name: str | None = None, *,
               status: ToolCallStatus | None = None,
               messages_key: str = "messages") -> list[ToolCall]:
    """The tool calls in ``state[messages_key]``, in the order the model asked for them, each
    with the answer its ``ToolMessage`` gave (``status="requested"`` while it has none).

    ``name`` keeps the calls of one tool, ``status`` those in one status. Write invariants to
    accept a state without messages: they also run on the input state."""
    messages: Iterable[Any] = state.get(messages_key) or ()
    calls: list[ToolCall] = []
    waiting: dict[str, list[int]] = {}  # call id -> its unanswered calls (ids may repeat)
    for message in messages:
        for asked in _get(message, "tool_calls", None) or ():
            call_id = str(_get(asked, "id", "") or "")
            waiting.setdefault(call_id, []).append(len(calls))
            calls.append(ToolCall(call_id, str(_get(asked, "name", "")),
                                  dict(_get(asked, "args", None) or {})))
        answered = _get(message, "tool_call_id", None)
        if answered is None or not waiting.get(str(answered)):
            continue
        index = waiting[str(answered)].pop(0)
        call = calls[index]
        outcome: ToolCallStatus = ("error" if _get(message, "status", "success") == "error"
                                   else "success")
        calls[index] = ToolCall(call.id, call.name, call.args, outcome,
                                _get(message, "content"), _get(message, "artifact"))
    return [c for c in calls
            if (name is None or c.name == name) and (status is None or c.status == status)]


def tool_call_of(step: Any, state: Any) -> ToolCall | None:
    """The tool call a journaled step made (``None`` for a node's step). A call left in doubt
    (its process died inside it) journaled no result: its arguments are read from the model's
    message in ``state``, so that an ``in_doubt_safe`` compensation can look for its effect."""
    if TOOL_TAG not in (step.tags or ()):
        return None
    found = ToolCall.from_update(step.update)
    if found is not None:
        return found
    call_id = str(step.step_id).split(":", 1)[-1]
    if isinstance(state, Mapping):
        for call in tool_calls(state, step.node):
            if call.id == call_id:
                return call
    return ToolCall(call_id, step.node)
