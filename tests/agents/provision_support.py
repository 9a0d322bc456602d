"""The agents that call AWS on the local AWS (the ``aws`` fixture), guarded as a script would
guard them: for tests/agents/test_provision*.py, test_cleanup.py and their crash program
(``aws_procs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents import registry
from agents.registry import AgentSettings, AgentSpec, AwsSettings
from stateguard import SagaAborted, StateGuardCheckpointer

NODES = ["create_group", "launch_instance", "attach_address", "create_record"]
NOTHING: dict[str, list[str]] = {"groups": [], "instances": [], "addresses": [], "records": []}
UNDO_KINDS = ["deletion", "release", "termination", "deletion"]  # newest first: record, ...


def agent_spec(agent: str, aws: AwsSettings, **options: Any) -> AgentSpec:
    """``agent``'s spec on the AWS ``aws`` names, with ``options`` for it."""
    return registry.get(agent, AgentSettings(
        stripe_api_key="sk_test_unused", stripe_api_base="http://127.0.0.1:9",
        sandbox_dir=Path("/nonexistent"), aws=aws,
        options={agent: options} if options else {}))


def provision(aws: AwsSettings, **options: Any) -> AgentSpec:
    return agent_spec("provision", aws, **options)


def in_memory(aws: AwsSettings, agent: str = "provision") -> tuple[StateGuardCheckpointer, Any]:
    """A guard on LangGraph's in-memory saver and journal, and the agent compiled by it."""
    spec = agent_spec(agent, aws)
    guard = StateGuardCheckpointer(**spec.guard_kwargs())
    return guard, guard.compile(spec.build())


def run(guard: StateGuardCheckpointer, graph: Any, thread: str, **input: Any) -> Any:
    return guard.invoke(graph, input, {"configurable": {"thread_id": thread}})


def server(name: str, zone: str = "stateguard.test") -> dict[str, list[str]]:
    """What a provisioned ``name`` is, as ``AwsWorld.live()`` counts it."""
    return {"groups": [name], "instances": [name], "addresses": [name],
            "records": [f"{name}.{zone}."]}


def ledger(guard: StateGuardCheckpointer, thread: str) -> list[tuple[str, str, str]]:
    """The run's effects in the ledger: (kind, status, what it undoes), in recorded order."""
    return [(e.effect.kind, str(e.status), e.effect.undoes)
            for e in guard.journal.effects(thread)]  # type: ignore[attr-defined]


def undone(aborted: SagaAborted) -> list[tuple[str, str]]:
    """What each compensation of an aborted run did, newest first."""
    return [(c.node, str(c.status)) for c in aborted.report.outcomes]
