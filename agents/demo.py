"""``make run`` until the web app exists: the checkout story, told against a local Stripe.

Starts localstripe on 127.0.0.1 (unless ``STRIPE_API_BASE`` points at a Stripe already), then
runs three checkouts through a guarded graph and prints what happened to the money.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stripe

from agents.checkout import checkout_builder, checkout_guard_kwargs
from stateguard import Event, SagaAborted, SqliteJournal, StateGuardCheckpointer

LAUNCHER = Path(__file__).resolve().parents[1] / "tools" / "localstripe_server.py"


@contextmanager
def local_stripe() -> Iterator[str]:
    if os.environ.get("STRIPE_API_BASE"):
        yield os.environ["STRIPE_API_BASE"]
        return
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if "listening on" not in line:
            raise SystemExit(f"localstripe did not start: {line!r}")
        yield line.rsplit(" ", 1)[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def show(event: Event) -> None:
    if event.type in ("step.succeeded", "step.failed", "invariant.violated",
                      "compensation.succeeded", "compensation.failed", "approval.requested"):
        detail = event.data.get("error") or event.data.get("status") or ""
        print(f"    [{event.type}] {event.node or ''} {detail}".rstrip())


def money(client: stripe.StripeClient, state: dict[str, Any]) -> str:
    if not state.get("charge_id"):
        return "no charge"
    charge = client.v1.charges.retrieve(state["charge_id"])
    return f"charged {charge.amount / 100:.2f}, refunded {charge.amount_refunded / 100:.2f}"


def main() -> int:
    with local_stripe() as base, tempfile.TemporaryDirectory() as tmp:
        client = stripe.StripeClient(os.environ.get("STRIPE_API_KEY", "sk_test_demo"),
                                     base_addresses={"api": base})
        print(f"Stripe stand-in: {base}\n")
        guard = StateGuardCheckpointer(journal=SqliteJournal(Path(tmp) / "journal.db"),
                                       approvals={"charge_user": lambda s: s["amount"] > 100_00},
                                       on_event=show, **checkout_guard_kwargs(client))
        graph = guard.compile(checkout_builder(client))
        order = {"email": "alice@example.com", "amount": 42_00, "currency": "usd"}

        print("1. A checkout that succeeds")
        config: Any = {"configurable": {"thread_id": "demo-ok"}}
        out = guard.invoke(graph, order, config)
        print(f"   -> {out['order_id']}; {money(client, out)}\n")

        print("2. Booking fails after the card was charged")
        config = {"configurable": {"thread_id": "demo-fail"}}
        try:
            guard.invoke(graph, {**order, "fail_booking": True}, config)
        except SagaAborted as exc:
            print(f"   -> {exc}")
            print(f"   -> {money(client, graph.get_state(config).values)}\n")

        print("3. A large order waits for an operator")
        config = {"configurable": {"thread_id": "demo-approval"}}
        guard.invoke(graph, {**order, "amount": 250_00}, config)
        print(f"   -> run is {guard.status(config).run.status}; alice approves")
        out = guard.approve(graph, config, by="alice")
        print(f"   -> {out['order_id']}; {money(client, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
