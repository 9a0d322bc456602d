"""The "noop5" agent: five steps that do nothing, each with a compensation. For benchmarks: it
measures what StateGuard and the stack cost per run, with no effect of its own, so it is
registered as a benchmark and offered to users only where benchmarks are enabled."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from agents.registry import AgentInput, AgentSettings, AgentSpec, register

STEPS = tuple(f"step{i}" for i in range(1, 6))


class NoopInput(AgentInput):
    n: int = 0


class NoopState(TypedDict, total=False):
    n: int


def _step(state: dict[str, Any]) -> dict[str, Any]:
    return {"n": state.get("n", 0) + 1}


def _undo(state: dict[str, Any], ctx: Any) -> bool:
    return True


def build() -> StateGraph[Any, Any, Any, Any]:
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(NoopState)
    for name in STEPS:
        builder.add_node(name, _step)
    for a, b in zip([START, *STEPS], [*STEPS, END], strict=True):
        builder.add_edge(a, b)
    return builder


@register("noop5", benchmark=True)
def spec(settings: AgentSettings) -> AgentSpec:
    return AgentSpec(name="noop5", build=build, input_schema=NoopInput,
                     invariants=(lambda s: s.get("n", 0) >= 0,),
                     compensations={name: _undo for name in STEPS},
                     description="Five no-op steps (benchmarks).")
