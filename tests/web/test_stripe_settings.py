"""How the deployment's Stripe retries and timeout (``STRIPE_MAX_NETWORK_RETRIES``,
``STRIPE_TIMEOUT_SECONDS``) reach the agents, and which values it refuses."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from stateguard import Retriable
from stateguard_web.runs import runtime

SETTINGS_PY = str(Path(__file__).resolve().parents[2] / "stateguard_web" / "settings.py")


def test_it_gives_the_agents_the_deployments_stripe_retries_and_timeout(
        settings: Any) -> None:
    settings.STRIPE_MAX_NETWORK_RETRIES, settings.STRIPE_TIMEOUT_SECONDS = 3, 7.5
    made = runtime.agent_settings()
    assert (made.stripe_max_network_retries, made.stripe_timeout) == (3, 7.5)
    kinds = runtime.agent_spec("checkout").kinds  # rebuilt for the new settings
    assert set(kinds) == {"create_customer", "charge_user"}
    assert all(isinstance(k, Retriable) for k in kinds.values())

    settings.STRIPE_MAX_NETWORK_RETRIES = 0  # the tests': an error holds the run at once
    assert runtime.agent_spec("checkout").kinds == {}


@pytest.mark.parametrize(("name", "value"), [("STRIPE_MAX_NETWORK_RETRIES", "-1"),
                                             ("STRIPE_MAX_NETWORK_RETRIES", "11"),
                                             ("STRIPE_TIMEOUT_SECONDS", "0"),
                                             ("STRIPE_TIMEOUT_SECONDS", "soon")])
def test_it_refuses_stripe_retries_and_timeouts_out_of_range(
        name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        runpy.run_path(SETTINGS_PY)
