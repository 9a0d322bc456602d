"""``stateguard.testing``: a pytest plugin, the way to test an agent's sagas.

Installed with stateguard (the ``pytest11`` entry point ``stateguard.testing``), it gives every
test the ``saga_chaos`` fixture, the saga chaos harness (``stateguard.chaos``): it runs the
agent once per failure point (an exception before and after each step's body, an invariant
broken after each node, a crash before and after each body, recovered by another guard) and
checks the outside world after each::

    def test_checkout_survives_chaos(saga_chaos, stripe_client):
        saga_chaos(lambda: checkout_builder(stripe_client),
                   guard=checkout_guard_kwargs(stripe_client),
                   input={"email": "alice@example.com", "amount": 4200},
                   check=charges_refunded_once,     # check(run): raises if the world is wrong
                   reset=empty_the_stripe_sandbox)  # a fresh world before each run

A case that left the world wrong fails the test with one table of them all. The plugin loads
in every pytest session: it imports nothing heavy until a test asks for the fixture
(``-p no:stateguard.testing`` turns it off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from stateguard.chaos import ChaosReport

__all__ = ["saga_chaos"]


@pytest.fixture
def saga_chaos() -> Callable[..., ChaosReport]:
    """The saga chaos harness: ``saga_chaos(build, input=..., check=..., guard={...},
    config=None, reset=None, resume=False, cases=CASE_KINDS, saver=None, asynchronous=False)``
    (the arguments of
    ``stateguard.chaos.run_saga_chaos``). Returns the report when every case left the world
    right; fails the test with the table of the cases that did not."""
    from stateguard.chaos import ChaosFailed, run_saga_chaos  # LangGraph: only when used

    def run(build: Callable[[], Any], **kwargs: Any) -> ChaosReport:
        try:
            return run_saga_chaos(build, **kwargs)
        except ChaosFailed as failed:
            table = str(failed)
        pytest.fail(table, pytrace=False)  # outside the except: the table once, no chain

    return run
