"""agents/registry.py: what the deployment hands its agents."""

from __future__ import annotations

from pathlib import Path

import pytest
from langgraph.graph import StateGraph
from pydantic import BaseModel, ConfigDict

from agents import registry
from agents.registry import AgentInput, AgentSettings, AgentSpec, register
from stateguard import Compensation, CompensationRetry, ConfigurationError, RetryLater
from tests.agents.registry_support import own_registry


def test_it_keeps_the_stripe_key_out_of_the_settings_repr() -> None:
    # A repr ends up in logs, tracebacks (pytest, Celery, Sentry show locals) and the shell.
    settings = AgentSettings(stripe_api_key="sk_live_secret123", sandbox_dir=Path("/tmp/sb"),
                             stripe_api_base="https://api.stripe.com")

    text = repr(settings)

    assert "sk_live_secret123" not in text and "stripe_api_key" not in text
    assert "https://api.stripe.com" in text and "sandbox_dir" in text  # the rest still shows
    assert settings.stripe_api_key == "sk_live_secret123"


def test_it_refuses_an_agent_whose_input_schema_would_coerce_or_take_unknown_fields() -> None:
    class Lenient(BaseModel):  # "4200" would become 4200
        model_config = ConfigDict(extra="forbid")
        amount: int

    class Open(AgentInput):
        model_config = ConfigDict(extra="allow")
        amount: int

    class Strict(AgentInput):
        amount: int

    for schema in (Lenient, Open):
        with pytest.raises(ConfigurationError, match=r"subclass agents\.registry\.AgentInput"):
            AgentSpec(name="shop", build=StateGraph, input_schema=schema)
    assert AgentSpec(name="shop", build=StateGraph, input_schema=Strict).input_schema is Strict


class Order(AgentInput):
    amount: int


def test_it_gives_the_deployments_wait_to_each_retry_policy_that_sets_none() -> None:
    deployment = RetryLater(initial=30, cap=3600, budget=86400)
    own = RetryLater(initial=1, cap=2, budget=3)

    def undo(state: object, ctx: object) -> bool:
        return True

    spec = AgentSpec(name="shop", build=StateGraph, input_schema=Order, compensations={
        "plain": undo,  # the agent's policy: the guard's compensation_retry
        "tuned": Compensation(undo, retry=CompensationRetry(attempts=2)),
        "patient": Compensation(undo, retry=CompensationRetry(later=own), in_doubt_safe=True),
    })

    kwargs = spec.guard_kwargs(later=deployment)

    comps = kwargs["compensations"]
    assert kwargs["compensation_retry"].later is deployment and comps["plain"] is undo
    assert (comps["tuned"].retry.attempts, comps["tuned"].retry.later) == (2, deployment)
    assert (comps["patient"].retry.later, comps["patient"].in_doubt_safe) == (own, True)
    agents_own = AgentSpec(name="shop", build=StateGraph, input_schema=Order,
                           compensation_retry=CompensationRetry(attempts=9, later=own))
    assert agents_own.guard_kwargs(later=deployment)["compensation_retry"] == (
        CompensationRetry(attempts=9, later=own))
    off = spec.guard_kwargs()  # the deployment does not wait: no policy is changed
    assert off["compensation_retry"].later is None
    assert off["compensations"]["tuned"].retry.later is None


def shop_spec(settings: AgentSettings) -> AgentSpec:
    return AgentSpec(name="shop", build=StateGraph, input_schema=Order, description="now")


def old_shop_spec(settings: AgentSettings) -> AgentSpec:
    return AgentSpec(name="shop", build=StateGraph, input_schema=Order, description="before")


def test_it_keeps_an_older_version_for_the_runs_that_started_on_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own_registry(monkeypatch)
    register("shop", version="1", draining=True)(old_shop_spec)
    register("shop", version="2")(shop_spec)
    settings = AgentSettings(stripe_api_key="", stripe_api_base="", sandbox_dir=Path("/tmp"))

    assert (registry.version("shop"), registry.draining("shop")) == ("2", ["1"])
    assert registry.names().count("shop") == 1  # new runs: one agent, its current version
    assert registry.get("shop", settings).description == "now"
    assert registry.get("shop", settings, version="2").description == "now"
    assert registry.get("shop", settings, version="1").description == "before"
    with pytest.raises(KeyError):
        registry.get("shop", settings, version="0")


def test_it_refuses_a_draining_version_it_could_not_tell_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own_registry(monkeypatch)
    register("shop", version="2")(shop_spec)
    register("shop", version="1", draining=True)(old_shop_spec)

    for version in ("", "1", "2"):  # none, the kept one again, the current one
        with pytest.raises(ConfigurationError, match="a draining version needs a version"):
            register("shop", version=version, draining=True)(old_shop_spec)
    register("cart", version="1", draining=True)(old_shop_spec)  # and no current "cart"
    monkeypatch.setattr(registry, "_complete", False)
    with pytest.raises(ConfigurationError, match=r"\['cart'\] keep draining versions"):
        registry.names()
