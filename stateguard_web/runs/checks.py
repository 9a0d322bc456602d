"""``manage.py check`` for the agents this deployment can run (``runtime.agent_names`` and the
benchmark ones): every module that names agents imports, and each agent's spec builds from this
deployment's settings, its graph compiles under its guard (whose compile refuses compensation,
approval and kind keys that name none of its nodes, tools or tasks) and its input schema gives
a JSON schema. Each error names the agent, so a team adding its own sees which one is wrong."""

from __future__ import annotations

from typing import Any

from django.core import checks

from agents import registry
from stateguard import StateGuardCheckpointer
from stateguard_web.runs import runtime


def _problem(agent: str, what: str, exc: BaseException, id: str) -> checks.Error:
    return checks.Error(f"agent {agent!r}: {what}: {type(exc).__name__}: {exc}", id=id,
                        hint="docs/agents.md says what an agent's spec must hold")


def check_agent(name: str) -> list[checks.CheckMessage]:
    try:
        spec = registry.get(name, runtime.agent_settings())
    except Exception as exc:
        return [_problem(name, "its spec cannot be made from this deployment's settings",
                         exc, "stateguard.E101")]
    try:
        guard = StateGuardCheckpointer(**spec.guard_kwargs())
        guard.compile(spec.build())
    except Exception as exc:
        return [_problem(name, "its graph does not compile under its guard", exc,
                         "stateguard.E102")]
    try:
        spec.input_schema.model_json_schema()
    except Exception as exc:
        return [_problem(name, f"its input schema {spec.input_schema.__name__} gives no "
                         "JSON schema", exc, "stateguard.E103")]
    return []


@checks.register("stateguard")
def check_agents(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        names = registry.names(benchmarks=True)
    except Exception as exc:  # a module STATEGUARD_AGENTS or an entry point names is broken
        return [checks.Error(str(exc), id="stateguard.E100",
                             hint="fix or remove the module named in STATEGUARD_AGENTS or "
                                  "the package's stateguard.agents entry point")]
    return [message for name in names for message in check_agent(name)]
