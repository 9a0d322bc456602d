"""The agents under the saga chaos harness (``saga_chaos``, stateguard's pytest plugin): every
failure point of a run, on localstripe and the sandbox, the world checked after each case."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import stripe

from agents import registry
from agents.checkout import checkout_builder, checkout_guard_kwargs
from agents.registry import AgentSettings
from stateguard import Compensation, ExceptionContext, RunStatus
from stateguard.chaos import ChaosFailed, ChaosReport, ChaosRun, run_saga_chaos
from tests.conftest import STRIPE_TEST_KEY, flush_localstripe
from tests.mail_server import MailServer

ORDER = {"email": "alice@example.com", "amount": 42_00, "currency": "usd"}


def stripe_is_right(client: stripe.StripeClient) -> Callable[[ChaosRun], None]:
    """The check of Stripe after a run: one charge at most; every charge of an unwound run
    refunded exactly once, and no charge refunded twice (whatever the run's end)."""
    def check(run: ChaosRun) -> None:
        charges = client.v1.charges.list(params={"limit": 100}).data
        refunds = client.v1.refunds.list(params={"limit": 100}).data
        twice = sorted(c for c, n in Counter(r.charge for r in refunds).items() if n > 1)
        assert not twice, f"refunded twice: {twice}"
        assert len(charges) <= 1, f"charged {len(charges)} times"
        if run.status == RunStatus.COMPENSATED:
            kept = [f"{c.id} ({c.amount - c.amount_refunded} of {c.amount})" for c in charges
                    if c.amount_refunded != c.amount]
            assert not kept, f"unwound, yet not refunded: {', '.join(kept)}"
        if run.status == RunStatus.SUCCEEDED:
            assert len(charges) == 1 and not refunds, "succeeded, yet not charged once"
    return check


def test_checkout_leaves_no_charge_behind_at_any_failure_point(
        saga_chaos: Callable[..., ChaosReport], stripe_client: stripe.StripeClient,
        localstripe_url: str) -> None:
    report = saga_chaos(lambda: checkout_builder(stripe_client), input=ORDER,
                        guard=checkout_guard_kwargs(stripe_client),
                        check=stripe_is_right(stripe_client),
                        reset=lambda: flush_localstripe(localstripe_url))

    assert [str(p) for p in report.points] == [
        "create_customer (node)", "charge_user (node)", "book_order (node)"]
    assert len(report.results) == 15
    # The charge raised after Stripe charged, or its process died there: refunded anyway
    # (its refund is in_doubt_safe and finds the charge by the run's metadata).
    after = {r.case.kind: r.run.status for r in report.results
             if r.case.point.name == "charge_user" and r.case.kind.endswith("after")}
    assert after == {"raise_after": RunStatus.COMPENSATED, "crash_after": RunStatus.COMPENSATED}


def test_a_refund_that_forgets_a_charge_whose_answer_was_lost_is_named(
        stripe_client: stripe.StripeClient, localstripe_url: str) -> None:
    def refund_from_state(state: dict[str, Any], ctx: ExceptionContext) -> bool:
        # What one writes first: the charge's id is in the state. Not when charge_user
        # raised (or died) after Stripe charged: then this forgets the charge.
        if not state.get("payment_intent_id"):
            return False
        stripe_client.v1.refunds.create(params={"payment_intent": state["payment_intent_id"]},
                                        options={"idempotency_key": ctx.idempotency_key})
        return True

    guard = checkout_guard_kwargs(stripe_client) | {
        "compensations": {"payment": Compensation(refund_from_state, in_doubt_safe=True)}}
    with pytest.raises(ChaosFailed) as caught:
        run_saga_chaos(lambda: checkout_builder(stripe_client), input=ORDER, guard=guard,
                       check=stripe_is_right(stripe_client),
                       reset=lambda: flush_localstripe(localstripe_url))

    table = str(caught.value)
    assert table.startswith("saga chaos: 2 of 15 cases left the world wrong")
    rows = [line.split("  ") for line in table.splitlines() if line.startswith("charge_user")]
    assert [[cell.strip() for cell in row if cell.strip()][:3] for row in rows] == [
        ["charge_user (node)", "exception after the body", "compensated"],
        ["charge_user (node)", "crash after the body", "compensated"]]
    assert all("unwound, yet not refunded: ch_" in line for line in table.splitlines()
               if line.startswith("charge_user"))


def test_travel_leaves_nothing_behind_at_any_failure_point(
        saga_chaos: Callable[..., ChaosReport], stripe_client: stripe.StripeClient,
        localstripe_url: str, tmp_path: Path, mail_server: MailServer) -> None:
    sandbox = tmp_path / "sandbox"
    spec = registry.get("travel", AgentSettings(stripe_api_key=STRIPE_TEST_KEY,
                                                stripe_api_base=localstripe_url,
                                                sandbox_dir=sandbox,
                                                mail=mail_server.settings()))
    stripe_right = stripe_is_right(stripe_client)

    def reset() -> None:
        flush_localstripe(localstripe_url)
        shutil.rmtree(sandbox, ignore_errors=True)
        sandbox.mkdir()
        for message in mail_server.folder.messages():  # what the server accepted before
            message.path.unlink()

    def check(run: ChaosRun) -> None:
        stripe_right(run)
        # The ledger has each charge and refund Stripe has: also a charge whose call died
        # before it recorded it, and a refund an earlier attempt made and did not record
        # (r1_chaos --agent travel found both missing).
        ledger = {e.effect.external_id for e in run.view.effects}
        at_stripe = [pi.id for pi in stripe_client.v1.payment_intents.list().data
                     if pi.status == "succeeded"]
        at_stripe += [r.id for r in stripe_client.v1.refunds.list().data]
        assert not set(at_stripe) - ledger, f"not in the ledger: {set(at_stripe) - ledger}"
        log = (sandbox / "effects.log").read_text().split() if (
            sandbox / "effects.log").exists() else []
        held = [line.split(":")[2] for line in log if line.startswith("do:reserve:")]
        cancelled = Counter(line.split(":")[2] for line in log
                            if line.startswith("undo:reserve:"))
        assert all(n == 1 for n in cancelled.values()), f"cancelled twice: {cancelled}"
        # What the SMTP server accepted: each message once, and an apology for each
        # confirmation of an unwound run, in reply to it.
        sent = mail_server.messages()
        mails = Counter("apology" if m["In-Reply-To"] else "confirmation" for m in sent)
        assert all(n == 1 for n in mails.values()), f"mailed twice: {mails}"
        if run.status == RunStatus.COMPENSATED:
            kept = [r for r in held if r not in cancelled]
            assert not kept, f"unwound, yet the room {kept} is still held"
            assert mails["apology"] == mails["confirmation"], (
                "unwound, yet the confirmation was not taken back")
            assert all(m["In-Reply-To"] == sent[0]["Message-ID"] for m in sent[1:])

    report = saga_chaos(spec.build, input=ORDER | {"destination": "Lisbon", "nights": 2},
                        guard=spec.guard_kwargs(), check=check, reset=reset)

    names = [p.name for p in report.points]
    assert names == ["agent", "tools", "charge_card", "agent", "tools", "reserve_hotel",
                     "agent", "tools", "send_confirmation", "agent"]
    assert len(report.results) == 10 * 4 + 7  # and an invariant after each of 7 nodes
    # Each call's compensation found its effect, in doubt too: no run was left to a person.
    assert {r.run.status for r in report.results} == {RunStatus.COMPENSATED}
