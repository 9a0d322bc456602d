"""/api/agents: what can be submitted, and how each agent is guarded."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.api.auth import principal
from stateguard_web.api.common import errors
from stateguard_web.api.schemas import AgentOut
from stateguard_web.runs import selectors

router = Router(tags=["agents"])


@router.get("", response={200: list[AgentOut], **errors()}, summary="List the agents")
def list_agents(request: HttpRequest) -> list[dict[str, object]]:
    """Each agent's name, description, nodes, the nodes that compensate, the approval gates,
    and the JSON schema of its input."""
    access.check(principal(request).user, Ability.VIEW)
    return selectors.agent_list()
