"""reconcile_effects on what the agents themselves did, in this process as a worker would run
them, on moto's server, a real SMTP server and localstripe: the ledger they keep agrees with
every provider, before and after an unwind; a row lost between the provider's answer and
record_effect (the ledger gap) is found, and --fix records it under the very step, key and node
the agent recorded it with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import stripe

from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Effect, Run
from tests.aws_world import AwsWorld
from tests.conftest import STRIPE_TEST_KEY
from tests.mail_server import MailServer
from tests.web.api.world import make_user
from tests.web.conftest import AGENT_INPUTS, agent_world
from tests.web.payments.test_reconcile_providers import reconcile


def run_agent(agent: str) -> Run:
    run = services.run_submit(agent=agent, by=make_user(f"{agent}-alice", "submitter"),
                              input=AGENT_INPUTS[agent])
    tasks.run_execute(run.pk)  # in this process, as a worker would
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    return run


def compensate(run: Run) -> None:
    services.run_compensate(run=run, by=make_user(f"{run.agent}-bob", "operator"))
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])
    run.refresh_from_db()
    assert run.status == Run.Status.COMPENSATED


def lose(run: Run, kind: str) -> dict[str, Any]:
    """Take the run's effect of ``kind`` out of the ledger, as if its step died before
    recording it; what it was."""
    effect = run.effects.get(kind=kind, undoes="")
    was = {f: getattr(effect, f) for f in ("external_id", "step_id", "node", "idempotency_key")}
    Effect.objects.filter(pk=effect.pk).delete()
    return was


def test_a_provisioned_servers_ledger_gap_is_found_and_its_unwind_leaves_no_drift(
        transactional_db: None, settings: Any, tmp_path: Path, aws: AwsWorld) -> None:
    settings.STATEGUARD_SANDBOX_DIR = str(tmp_path)
    run = run_agent("provision")
    assert reconcile("--provider", "aws") == (
        0, ["4 resource(s) compared with AWS: 0 drift(s)"])

    lost = lose(run, "elastic_ip")
    status, lines = reconcile("--provider", "aws", "--fix")
    assert status == 0 and lines[0].startswith(f"FIXED {lost['external_id']} (run {run.code})")
    found = Effect.objects.get(external_id=lost["external_id"])
    assert {f: getattr(found, f) for f in lost} == lost  # its step, node and token

    compensate(run)
    assert aws.live() == {"groups": [], "instances": [], "addresses": [], "records": []}
    assert reconcile("--provider", "aws") == (
        0, ["4 resource(s) compared with AWS: 0 drift(s)"])


def test_a_trips_mail_charge_and_a_deleted_files_marker_agree_with_their_providers(
        transactional_db: None, settings: Any, tmp_path: Path, localstripe_url: str,
        stripe_client: stripe.StripeClient, mail_server: MailServer, aws: AwsWorld) -> None:
    settings.STRIPE_API_KEY, settings.STRIPE_API_BASE = STRIPE_TEST_KEY, localstripe_url
    settings.STATEGUARD_SANDBOX_DIR = str(tmp_path)
    mail_server.use_in(settings)
    agent_world("cleanup", aws)
    trip, cleanup = run_agent("travel"), run_agent("cleanup")
    compensate(trip)  # a refund and an apology

    status, lines = reconcile()
    assert (status, lines) == (0, [
        "1 charge(s) compared with Stripe: 0 drift(s)",
        "0 resource(s) compared with AWS: 0 drift(s)",
        "1 delete marker(s) compared with S3: 0 drift(s)",
        "2 message(s) compared with the SMTP server: 0 drift(s)"])

    mail, marker = lose(trip, "email"), lose(cleanup, "delete_marker")  # the first e-mail
    status, lines = reconcile("--provider", "smtp", "--provider", "s3", "--fix")
    assert status == 0, lines
    for lost in (mail, marker):
        found = Effect.objects.get(external_id=lost["external_id"])
        assert {f: getattr(found, f) for f in lost} == lost
    assert trip.effects.get(external_id=mail["external_id"]).status == "compensated"
