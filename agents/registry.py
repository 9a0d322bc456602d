"""The agents this deployment runs, by name.

An ``AgentSpec`` says everything the web app needs to run an agent as a saga: how to build its
graph, its invariants, compensations and approval gates, the schema its input must satisfy, and
what to do with a run whose worker died (``on_crash``: unwind it, or resume it when every node is
idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langgraph.graph import StateGraph
from pydantic import BaseModel

from stateguard import ConfigurationError


@dataclass(frozen=True)
class AgentSpec:
    name: str
    build: Callable[[], StateGraph[Any, Any, Any, Any]]
    input_schema: type[BaseModel]
    invariants: tuple[Callable[[dict[str, Any]], bool], ...] = ()
    compensations: Mapping[str, Any] = field(default_factory=dict)
    approvals: Mapping[str, Any] | tuple[str, ...] = ()
    on_crash: Literal["unwind", "resume"] = "unwind"
    description: str = ""

    def guard_kwargs(self) -> dict[str, Any]:
        return {"invariants": list(self.invariants), "compensations": dict(self.compensations),
                "approvals": self.approvals or None}


_REGISTRY: dict[str, Callable[[], AgentSpec]] = {}


def register(name: str) -> Callable[[Callable[[], AgentSpec]], Callable[[], AgentSpec]]:
    """Register a factory that makes the agent's spec (called when the agent is first used, so
    that settings such as Stripe keys are read at run time, not at import)."""
    def decorator(factory: Callable[[], AgentSpec]) -> Callable[[], AgentSpec]:
        if name in _REGISTRY:
            raise ConfigurationError(f"agent {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory
    return decorator


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> AgentSpec:
    _load()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise KeyError(name)
    return factory()


def _load() -> None:
    # Importing the agent modules registers them.
    from agents import checkout_agent, noop, provision  # noqa: F401
