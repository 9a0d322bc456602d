"""Runs that charged a card at localstripe, people who may (or may not) refund them, and a
proxy between the SDK and localstripe that makes Stripe fail on purpose.

alice is a superuser; bob an operator (the role's group) with staff status, so he may use the
admin; charlie a viewer with staff status, who may read runs but not refund.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import stripe
from django.contrib.auth import get_user_model
from django.test import override_settings

from stateguard.effects import Effect as CoreEffect
from stateguard.effects import EffectRecord
from stateguard_web.accounts import services as accounts
from stateguard_web.payments import selectors
from stateguard_web.runs import runtime
from stateguard_web.sagas.models import Effect, Run
from tests.conftest import STRIPE_TEST_KEY


def people() -> dict[str, Any]:
    users = get_user_model().objects
    alice = users.create_superuser("alice", password="pw")
    bob = users.create_user("bob", password="pw", is_staff=True)
    accounts.role_grant(user=bob, role="operator")
    charlie = users.create_user("charlie", password="pw", is_staff=True)
    accounts.role_grant(user=charlie, role="viewer")
    return {"alice": alice, "bob": bob, "charlie": charlie}


def charge(client: stripe.StripeClient, run: Run, amount: int = 2000, *,
           record: bool = True, ledger_amount: int | None = None) -> str:
    """A succeeded PaymentIntent of ``run`` at localstripe, tagged as the checkout agent tags
    them, and (with ``record``) its charge in the ledger as the agent records it; its id."""
    customer = client.v1.customers.create(params={"email": "customer@example.com"})
    intent = client.v1.payment_intents.create(params={
        "amount": amount, "currency": "usd", "customer": customer.id,
        "payment_method": "pm_card_visa", "confirm": True,
        "metadata": {"stateguard_run": str(run.code), "stateguard_step": "charge_user"}})
    if record:
        runtime.journal().effect_record(EffectRecord(
            str(run.code), "step-charge", "charge_user",
            CoreEffect("stripe", "charge", intent.id, amount=ledger_amount or amount,
                       currency="usd", idempotency_key=f"stateguard:{run.code}:charge_user")))
    return str(intent.id)


def ledger(external_id: str) -> Effect:
    return Effect.objects.get(provider="stripe", external_id=external_id)


def refunds_at_stripe(client: stripe.StripeClient, intent_id: str) -> list[Any]:
    charge_id = selectors.stripe_charge(client, intent_id).id
    return list(client.v1.refunds.list(params={"charge": charge_id}).auto_paging_iter())


def refunded_at_stripe(client: stripe.StripeClient, intent_id: str) -> int:
    return int(selectors.stripe_charge(client, intent_id).amount_refunded)


@contextlib.contextmanager
def both_read_before_either_refunds(wait: float = 2.0) -> Iterator[None]:
    """Two refunds at once, made to overlap: each waits, after reading the charge at Stripe,
    for the other to have read it too (at most ``wait`` seconds). Without the row lock both
    read "nothing refunded" and both refund; with it, the second reads after the first
    committed (the first's wait times out)."""
    barrier = threading.Barrier(2)
    real = selectors.stripe_charge

    def read_then_wait(client: stripe.StripeClient, external_id: str) -> Any:
        found = real(client, external_id)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=wait)
        return found

    with mock.patch.object(selectors, "stripe_charge", read_then_wait):
        yield


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads at the same moment; their results (or exceptions)."""
    from django.db import connection

    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()  # this thread's own connection

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


class StripeProxy:
    """Between the SDK and localstripe: forwards every request, except that a request whose
    method and path are in ``faults`` gets, instead:

    * ``"refused"``: a 400 from "Stripe" (localstripe is not asked);
    * ``"down"``: a 500 (Stripe failing on its side; not asked either);
    * ``"lost"``: localstripe does it, and the answer is lost (the connection is closed).

    A request in ``held`` (method, path → an event) waits, before it is forwarded, until its
    event is set (at most a minute): Stripe slow to answer. ``arrived`` is set when one came."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults: dict[tuple[str, str], str] = {}
        self.held: dict[tuple[str, str], threading.Event] = {}
        self.arrived = threading.Event()
        self.seen: list[tuple[str, str]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                path = self.path.split("?")[0]
                proxy.seen.append((self.command, path))
                release = proxy.held.get((self.command, path))
                if release is not None:
                    proxy.arrived.set()
                    release.wait(timeout=60)
                fault = proxy.faults.get((self.command, path))
                if fault in ("refused", "down"):
                    status, kind = (400, "invalid_request_error") if fault == "refused" \
                        else (500, "api_error")
                    self._answer(status, json.dumps({"error": {
                        "type": kind, "message": f"injected: Stripe {fault} this"}}).encode())
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                request = urllib.request.Request(proxy.upstream + self.path, data=body,
                                                 headers=headers, method=self.command)
                try:
                    with urllib.request.urlopen(request, timeout=30) as resp:
                        status, data = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                if fault == "lost":
                    self.close_connection = True
                    return  # localstripe acted; the client hears nothing
                self._answer(status, data)

            def _answer(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StripeProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class StripeWorld:
    """Mixed into a ``TestCase``: localstripe, emptied, and the app's settings pointing at it
    (``self.stripe`` is a client of the tests' own)."""

    stripe: stripe.StripeClient
    localstripe: str

    @pytest.fixture(autouse=True)
    def _localstripe(self, stripe_client: stripe.StripeClient,
                     localstripe_url: str) -> Iterator[None]:
        self.stripe, self.localstripe = stripe_client, localstripe_url
        with override_settings(STRIPE_API_KEY=STRIPE_TEST_KEY, STRIPE_API_BASE=localstripe_url):
            yield

    @contextlib.contextmanager
    def proxied(self) -> Iterator[StripeProxy]:
        """The app talks to Stripe through a ``StripeProxy`` (the tests' client does not)."""
        with StripeProxy(self.localstripe) as proxy, override_settings(
                STRIPE_API_BASE=proxy.url):
            yield proxy
