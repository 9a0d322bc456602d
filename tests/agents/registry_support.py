"""A registry of the tests' own: agents registered in a test are gone after it."""

from __future__ import annotations

import pytest

from agents import registry


def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give the test copies of the registry's tables (the shipped agents in them), which
    ``monkeypatch`` puts back afterwards: what the test registers, or removes (a "deploy"),
    reaches no other test."""
    registry.names()  # every source imported first, so that the copies hold them
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_VERSIONS", dict(registry._VERSIONS))
    monkeypatch.setattr(registry, "_DRAINING",
                        {name: dict(kept) for name, kept in registry._DRAINING.items()})
