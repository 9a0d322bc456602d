"""The localstripe fixtures work, and localstripe behaves the way our tests rely on."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import stripe

from tests.conftest import (
    LOCALSTRIPE_LAUNCHER,
    ROOT,
    STRIPE_TEST_KEY,
    _free_port,
    _port_answers,
)


def _charge_id(latest_charge: str | stripe.Charge | None) -> str:
    # localstripe returns latest_charge expanded; real Stripe returns the id string.
    assert latest_charge is not None
    return latest_charge if isinstance(latest_charge, str) else latest_charge.id


def _paid_intent(client: stripe.StripeClient) -> stripe.PaymentIntent:
    customer = client.v1.customers.create(params={"email": "fixture@example.com"})
    return client.v1.payment_intents.create(
        params={
            "amount": 1000,
            "currency": "usd",
            "customer": customer.id,
            "payment_method": "pm_card_visa",
            "confirm": True,
        }
    )


def test_payment_intent_and_duplicate_refunds(stripe_client: stripe.StripeClient) -> None:
    intent = _paid_intent(stripe_client)
    assert intent.status == "succeeded"
    charge_id = _charge_id(intent.latest_charge)

    stripe_client.v1.refunds.create(params={"charge": charge_id})
    assert stripe_client.v1.charges.retrieve(charge_id).amount_refunded == 1000

    # localstripe accepts a second full refund (real Stripe would reject it). Our tests
    # rely on this to detect double refunds: amount_refunded > amount.
    stripe_client.v1.refunds.create(params={"charge": charge_id})
    assert stripe_client.v1.charges.retrieve(charge_id).amount_refunded == 2000


def test_global_style_is_configured(stripe_client: stripe.StripeClient) -> None:
    customer = stripe.Customer.create(email="global@example.com")
    assert stripe_client.v1.customers.retrieve(customer.id).email == "global@example.com"


def test_store_is_flushed_between_tests(stripe_client: stripe.StripeClient) -> None:
    assert list(stripe_client.v1.customers.list().auto_paging_iter()) == []


def _non_loopback_addresses() -> set[str]:
    found: set[str] = set()
    hostname = shutil.which("hostname")
    if hostname:
        out = subprocess.run([hostname, "-I"], capture_output=True, text=True, check=False)
        found.update(out.stdout.split())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP connect sends nothing; picks the route's source
            found.add(s.getsockname()[0])
        except OSError:
            pass
    usable = set()
    for addr in found:
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            continue
        if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
            usable.add(addr)
    return usable


def test_listens_on_loopback_only(localstripe_url: str) -> None:
    port = urlsplit(localstripe_url).port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass

    addresses = _non_loopback_addresses()
    if not addresses:
        pytest.skip("no non-loopback address on this machine")
    for addr in sorted(addresses):
        with pytest.raises(OSError), socket.create_connection((addr, port), timeout=2):
            pass


def _start_localstripe(port: int, store: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(LOCALSTRIPE_LAUNCHER), "--port", str(port), "--store", str(store)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )
    deadline = time.monotonic() + 20
    while not _port_answers("127.0.0.1", port):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return proc


def test_it_keeps_charges_across_a_restart_with_a_store_file(tmp_path: Path) -> None:
    # `make run` passes --store: a refund after a restart of localstripe needs the charge.
    store, log, port = tmp_path / "var" / "localstripe.pickle", tmp_path / "ls.log", _free_port()
    url = f"http://127.0.0.1:{port}"
    client = stripe.StripeClient(STRIPE_TEST_KEY, base_addresses={"api": url})
    proc = _start_localstripe(port, store, log)
    try:
        charge_id = _charge_id(_paid_intent(client).latest_charge)
    finally:
        proc.kill()  # SIGKILL: what was answered must already be on disk
        proc.wait()
    assert not list(store.parent.glob("*.tmp")), "the store is written through a renamed file"

    proc = _start_localstripe(port, store, log)
    try:
        assert client.v1.charges.retrieve(charge_id).amount == 1000
        client.v1.refunds.create(params={"charge": charge_id})
        assert client.v1.charges.retrieve(charge_id).amount_refunded == 1000
    finally:
        proc.terminate()
        proc.wait(timeout=10)
