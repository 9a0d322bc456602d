"""An operator's "compensate" on a succeeded run, for every registered agent, end to end through
the web app: the service records the request, the task carries it out as a worker would, and
every compensation runs outside LangGraph's runnable context (only ``ctx`` tells it its run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import stripe

from agents import registry
from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Compensation, Run
from tests.aws_world import AwsWorld
from tests.conftest import STRIPE_TEST_KEY
from tests.mail_server import MailServer
from tests.web.api.world import make_user
from tests.web.conftest import AGENT_INPUTS, agent_world


def test_it_knows_an_input_for_every_registered_agent() -> None:
    # A newly registered agent fails here until it has an input, so that its compensations
    # (and its input schema: api/test_bad_input.py) are exercised too.
    assert sorted(AGENT_INPUTS) == registry.names(benchmarks=True)


@pytest.mark.parametrize("agent", sorted(AGENT_INPUTS))
def test_it_compensates_a_succeeded_run_of_every_agent(
        agent: str, transactional_db: None, settings: Any, tmp_path: Path,
        localstripe_url: str, stripe_client: stripe.StripeClient,
        mail_server: MailServer, aws: AwsWorld) -> None:
    settings.STRIPE_API_KEY, settings.STRIPE_API_BASE = STRIPE_TEST_KEY, localstripe_url
    settings.STATEGUARD_SANDBOX_DIR = str(tmp_path)
    mail_server.use_in(settings)
    settings.STATEGUARD_BENCH_AGENTS = True
    agent_world(agent, aws)
    alice, bob = make_user("alice", "submitter"), make_user("bob", "operator")
    run = services.run_submit(agent=agent, by=alice, input=AGENT_INPUTS[agent])
    tasks.run_execute(run.pk)  # in this process, as a worker would
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error

    services.run_compensate(run=run, by=bob, reason="the customer cancelled")
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])

    run.refresh_from_db()
    failed = [(c.node, c.status, [a.error for a in c.attempts.all()])
              for c in run.compensations.exclude(status=Compensation.Status.SUCCEEDED)]
    assert (run.status, failed) == (Run.Status.COMPENSATED, [])
    assert run.compensations.exists()


def test_it_apologises_for_a_travel_confirmation_and_refunds_the_trip(
        transactional_db: None, settings: Any, tmp_path: Path, localstripe_url: str,
        stripe_client: stripe.StripeClient, mail_server: MailServer) -> None:
    settings.STRIPE_API_KEY, settings.STRIPE_API_BASE = STRIPE_TEST_KEY, localstripe_url
    settings.STATEGUARD_SANDBOX_DIR = str(tmp_path)
    mail_server.use_in(settings)
    run = services.run_submit(agent="travel", by=make_user("alice", "submitter"),
                              input=AGENT_INPUTS["travel"])
    tasks.run_execute(run.pk)
    services.run_compensate(run=run, by=make_user("bob", "operator"))
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])

    confirmation, apology = mail_server.messages(run=str(run.code))  # over SMTP, one each
    assert apology["Subject"] == "Cancelled: your trip to Lisbon"
    assert apology["In-Reply-To"] == confirmation["Message-ID"]
    ledger = [(e.provider, e.kind, e.external_id, e.status, e.undoes)
              for e in run.effects.filter(provider="smtp").order_by("pk")]
    assert ledger == [
        ("smtp", "email", confirmation["Message-ID"], "compensated", ""),
        ("smtp", "email", apology["Message-ID"], "compensated", confirmation["Message-ID"])]
    [charge] = stripe_client.v1.charges.list().data
    assert (charge.amount, charge.amount_refunded) == (42_00, 42_00)
