"""Turning LangGraph states and node results into plain dicts, and applying a node's update.

Invariants and compensations always receive a plain ``dict`` of the graph's state keys, whatever
the state schema is (TypedDict, dataclass or pydantic model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from langgraph.channels.base import BaseChannel
from langgraph.errors import EmptyChannelError
from langgraph.types import Command


def as_dict(state: Any) -> dict[str, Any]:
    if isinstance(state, Mapping):
        return dict(state)
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    fields = getattr(type(state), "model_fields", None)  # pydantic v2
    if fields is not None:
        return {name: getattr(state, name) for name in fields}
    return {"value": state}


def is_internal_channel(name: str) -> bool:
    """LangGraph's bookkeeping channels (``branch:to:x``, ``__start__``...), not state keys."""
    return ":" in name or name.startswith("__")


def state_values(channel_values: Any) -> dict[str, Any]:
    """The state keys of a graph's values. An ``@entrypoint``'s values are its output, any
    value (``None`` before it returned): as a dict, like a node's result."""
    if not isinstance(channel_values, Mapping):
        return {} if channel_values is None else as_dict(channel_values)
    return {k: v for k, v in channel_values.items() if not is_internal_channel(k)}


def update_of(result: Any) -> dict[str, Any]:
    """The state update a node returned, as a dict (``Command.update`` included)."""
    if isinstance(result, Command):
        result = result.update
    if result is None:
        return {}
    if isinstance(result, Mapping):
        return dict(result)
    if isinstance(result, (list, tuple)) and all(
            isinstance(item, tuple) and len(item) == 2 for item in result):
        return dict(result)
    return as_dict(result)


def apply_update(channels: Mapping[str, Any], state: dict[str, Any],
                 update: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with ``update`` applied through the graph's own channel reducers."""
    merged = dict(state)
    for key, value in update.items():
        spec = channels.get(key)
        if not isinstance(spec, BaseChannel):  # unknown key or a managed value
            merged[key] = value
            continue
        channel = spec.from_checkpoint(merged[key]) if key in merged else spec.copy()
        try:
            channel.update([value])
            merged[key] = channel.get()
        except EmptyChannelError:
            merged.pop(key, None)
    return merged
