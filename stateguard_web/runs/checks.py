"""``manage.py check`` for the agents this deployment can run (``runtime.agent_names`` and the
benchmark ones): every module that names agents imports, and each agent's spec builds from this
deployment's settings, its graph compiles under its guard (whose compile refuses compensation,
approval and kind keys that name none of its nodes, tools or tasks) and its input schema gives
a JSON schema; so do the older versions an agent keeps for draining (docs/agents.md,
"Versions"). Each error names the agent (and the version), so a team adding its own sees which
one is wrong."""

from __future__ import annotations

from typing import Any

from django.core import checks

from agents import registry
from stateguard import StateGuardCheckpointer
from stateguard_web.runs import runtime


def _problem(who: str, what: str, exc: BaseException, id: str) -> checks.Error:
    return checks.Error(f"{who}: {what}: {type(exc).__name__}: {exc}", id=id,
                        hint="docs/agents.md says what an agent's spec must hold")


def check_agent(name: str, version: str | None = None) -> list[checks.CheckMessage]:
    shown = f"agent {name!r}" + ("" if version is None else f" version {version!r}")
    try:
        spec = registry.get(name, runtime.agent_settings(), version=version)
    except Exception as exc:
        return [_problem(shown, "its spec cannot be made from this deployment's settings",
                         exc, "stateguard.E101")]
    try:
        guard = StateGuardCheckpointer(**spec.guard_kwargs())
        guard.compile(spec.build())
    except Exception as exc:
        return [_problem(shown, "its graph does not compile under its guard", exc,
                         "stateguard.E102")]
    try:
        spec.input_schema.model_json_schema()
    except Exception as exc:
        return [_problem(shown, f"its input schema {spec.input_schema.__name__} gives no "
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
    return [message for name in names for version in [None, *registry.draining(name)]
            for message in check_agent(name, version)]
