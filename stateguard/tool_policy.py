"""``on_tool_error``: what a tool error that ``ToolNode`` told the model does to the run.

- ``"compensate"``: the run unwinds (the tool's node fails with ``ToolCallFailed``);
- ``"model"``: the model reads the error and goes on (the call is journaled failed, nothing is
  undone for it);
- ``"auto"`` (the default): compensate when the tool has a compensation, recorded an effect, or
  the run already has an effect to undo; otherwise (a read-only tool in a run with no effect
  yet) let the model handle it.

Per guard (one of the three) or per tool: a mapping of tool name or tool tag to one of them,
other tools getting ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from stateguard.exceptions import ConfigurationError

ToolErrorPolicy = Literal["auto", "compensate", "model"]
OnToolError = ToolErrorPolicy | Mapping[str, ToolErrorPolicy]
_POLICIES = ("auto", "compensate", "model")


def build_tool_error_policy(policy: Any) -> str | dict[str, str]:
    if isinstance(policy, str) and policy in _POLICIES:
        return policy
    if isinstance(policy, Mapping) and all(
            isinstance(k, str) and v in _POLICIES for k, v in policy.items()):
        return dict(policy)
    raise ConfigurationError(f"on_tool_error must be one of {list(_POLICIES)}, or a mapping of "
                             f"tool name or tag to one of them, not {policy!r}")
