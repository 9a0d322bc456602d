"""Retry from the web app (issue 8, item 10): checkout holds a run whose Stripe call could not get
through, and an operator's retry finishes it with one charge.

The outage is real: the worker talks to localstripe through a TCP relay in this process, and
switching the relay off closes its port and its open connections, so the stripe SDK in the
worker sees what it sees when Stripe is unreachable (``APIConnectionError``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import stripe

from agents import registry
from agents.checkout import BookingFailed, checkout_error_policy
from agents.registry import AgentSettings
from stateguard_web.runs import services
from stateguard_web.sagas.models import Run
from tests.web.conftest import Workers, wait_for


def test_it_holds_checkout_on_errors_a_retry_may_fix_and_unwinds_on_business_errors() -> None:
    hold = [stripe.APIConnectionError("connection refused"),
            stripe.RateLimitError("too many requests", http_status=429),
            stripe.APIError("internal error", http_status=500)]
    unwind = [stripe.CardError("card declined", param="card", code="card_declined"),
              BookingFailed("the warehouse rejected the order"),
              stripe.InvalidRequestError("no such customer", param="customer")]
    assert [checkout_error_policy(e) for e in hold] == ["hold"] * 3
    assert [checkout_error_policy(e) for e in unwind] == ["compensate"] * 3
    spec = registry.get("checkout", AgentSettings(
        stripe_api_key="sk_test_x", stripe_api_base="http://127.0.0.1:9", sandbox_dir=Path()))
    assert spec.guard_kwargs()["on_error"] is checkout_error_policy  # what the web app runs


class Relay:
    """A TCP relay to ``target`` on a port of its own, which can be switched off and on."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.port = 0
        self.listener: socket.socket | None = None
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def on(self) -> None:
        # The same port each time (SO_REUSEADDR is set by create_server), so the worker's
        # client, built once with this address, reaches Stripe again.
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def off(self) -> None:
        """Nothing listens any more, and the connections the client keeps alive are cut."""
        assert self.listener is not None
        # shutdown() first: close() alone leaves a socket that a thread is blocked accepting
        # on listening in the kernel, and it would go on accepting connections.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # switched off
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def relay(localstripe_url: str) -> Iterator[Relay]:
    relay = Relay(localstripe_url)
    relay.on()
    yield relay
    relay.off()


def status_is(run: Run, status: str) -> bool:
    run.refresh_from_db()
    return run.status == status


def test_it_holds_a_charge_that_could_not_reach_stripe_and_charges_once_on_retry(
        workers: Workers, sandbox: Path, stripe_client: stripe.StripeClient,
        relay: Relay) -> None:
    workers.env.update(STRIPE_API_BASE=relay.url, STRIPE_API_KEY="sk_test_stateguard")
    workers.start("w1")
    # Over 100.00 the charge waits for an approval: the customer is created while Stripe is
    # reachable, and the outage starts right before the charge.
    run = services.run_submit(agent="checkout", input={"email": "alice@example.com",
                                                       "amount": 250_00}, by="alice")
    wait_for(lambda: status_is(run, Run.Status.PAUSED), 60, "the run to pause", workers.logs)

    relay.off()
    services.run_approve(run=run, by="alice")
    wait_for(lambda: status_is(run, Run.Status.FAILED), 60, "the run to be held",
             workers.logs)
    # Held, not unwound: no charge was made, nothing was refunded, no compensation ran.
    assert run.error["type"] == "APIConnectionError"
    assert stripe_client.v1.charges.list().data == []
    assert stripe_client.v1.refunds.list().data == []
    assert not run.compensations.exists()
    assert dict(run.steps.values_list("node", "status")) == {
        "create_customer": "succeeded", "charge_user": "failed"}

    relay.on()  # Stripe answers again
    services.run_retry(run=run, by="bob")
    wait_for(lambda: status_is(run, Run.Status.SUCCEEDED), 60, "the retry to succeed",
             workers.logs)
    charges = stripe_client.v1.charges.list().data
    assert [(c.amount, c.amount_refunded) for c in charges] == [(250_00, 0)]  # exactly one
    assert len(stripe_client.v1.customers.list().data) == 1  # created once, before the outage


def test_it_counts_a_held_run_as_the_runs_outcome_not_the_tasks_failure(
        transactional_db: None, settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    from stateguard_web.runs import tasks

    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # nothing listens: Stripe is unreachable
    run = services.run_submit(agent="checkout", input={"email": "a@b.co", "amount": 42_00})
    tasks.run_execute(run.pk)  # as a worker would; the task itself must not fail
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and run.error["type"] == "APIConnectionError"
    assert "held for an operator: APIConnectionError" in caplog.text
