"""agents/registry.py: what the deployment hands its agents."""

from __future__ import annotations

from pathlib import Path

from agents.registry import AgentSettings


def test_it_keeps_the_stripe_key_out_of_the_settings_repr() -> None:
    # A repr ends up in logs, tracebacks (pytest, Celery, Sentry show locals) and the shell.
    settings = AgentSettings(stripe_api_key="sk_live_secret123", sandbox_dir=Path("/tmp/sb"),
                             stripe_api_base="https://api.stripe.com")

    text = repr(settings)

    assert "sk_live_secret123" not in text and "stripe_api_key" not in text
    assert "https://api.stripe.com" in text and "sandbox_dir" in text  # the rest still shows
    assert settings.stripe_api_key == "sk_live_secret123"
