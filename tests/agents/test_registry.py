"""agents/registry.py: what the deployment hands its agents."""

from __future__ import annotations

from pathlib import Path

import pytest
from langgraph.graph import StateGraph
from pydantic import BaseModel, ConfigDict

from agents.registry import AgentInput, AgentSettings, AgentSpec
from stateguard import ConfigurationError


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
