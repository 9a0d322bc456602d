"""/api/agents: what can be submitted, and how each agent is guarded."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils import timezone
from ninja import Router

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import (
    AgentMapOut,
    AgentName,
    AgentOut,
    AgentVersionOut,
    Window,
)
from stateguard_web.runs import agent_map, selectors

router = Router(tags=["agents"])


@router.get("", response={200: list[AgentOut], **errors()}, summary="List the agents")
def list_agents(request: HttpRequest) -> list[dict[str, object]]:
    """Each agent's name, description, nodes, the nodes that compensate, the approval gates,
    and the JSON schema of its input."""
    access.check(principal(request).user, Ability.VIEW)
    return selectors.agent_list()


@router.get("/{name}/map", response={200: AgentMapOut, **errors(404, 422)},
            summary="An agent's map: where its runs stand and stopped")
def get_agent_map(request: HttpRequest, name: AgentName,
                  window: Window = "24h") -> dict[str, object]:
    """For each node of the agent's graph (and each tool of an AI agent, under its tools
    node), how many of the agent's runs created in the window (`1h`, `24h` or `7d`) are now at
    it, wait for approval at it, failed at it, or were compensated after it, and the share of
    the window's runs that failed there. The runs behind a count: `GET /api/runs?agent=...&
    node=...&what=...&created_after=...`. Counts only the runs the caller may see."""
    who = principal(request)
    access.check(who.user, Ability.VIEW)
    try:
        return agent_map.agent_map_data(runs=access.visible_runs(who.user), agent=name,
                                        window=window, now=timezone.now())
    except KeyError:
        raise selectors.NotFound(f"no agent {name!r}: GET /api/agents lists them") from None


@router.get("/{name}/versions", response={200: list[AgentVersionOut], **errors(404, 422)},
            summary="An agent's versions and their unfinished runs")
def list_agent_versions(request: HttpRequest, name: AgentName) -> list[dict[str, object]]:
    """The agent's current version, the older ones it keeps registered for draining, and the
    versions no longer registered that still have runs, each with how many of its runs are
    not finished (that the caller may see). A draining version with none left can be removed
    from the agent's module: docs/agents.md, "Versions"."""
    who = principal(request)
    access.check(who.user, Ability.VIEW)
    return selectors.agent_versions(runs=access.visible_runs(who.user), agent=name)
