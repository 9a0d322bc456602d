"""The provision agent makes a server on AWS (moto's server, through boto3) and, when a step
fails, removes exactly what it made, newest first; the ledger has each part and its removal.
Everything is counted through the AWS API (``tests/aws_world.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import registry
from agents.provision import Provisioner, ProvisioningFailed
from agents.registry import AgentSettings, AwsSettings
from stateguard import ConfigurationError, SagaAborted
from tests.agents.provision_support import (
    NODES,
    NOTHING,
    UNDO_KINDS,
    in_memory,
    ledger,
    provision,
    run,
    server,
    undone,
)
from tests.aws_world import AwsWorld


def test_it_provisions_a_server_and_records_each_part_in_the_ledger(aws: AwsWorld) -> None:
    guard, graph = in_memory(aws.settings)
    done = run(guard, graph, "run-1", name="web-1", instance_type="t3.small")

    assert aws.live() == server("web-1")
    [instance] = [i for r in aws.ec2.describe_instances(InstanceIds=[done["instance_id"]])[
        "Reservations"] for i in r["Instances"]]
    assert (instance["InstanceType"], instance["State"]["Name"]) == ("t3.small", "running")
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [done["group_id"]]
    [address] = aws.ec2.describe_addresses(AllocationIds=[done["allocation_id"]])["Addresses"]
    assert (address["InstanceId"], address["PublicIp"]) == (done["instance_id"], done["address"])
    assert done["record"] == {"name": "web-1.stateguard.test.", "value": done["address"]}
    [zone] = aws.route53.list_hosted_zones()["HostedZones"]
    records = {(s["Name"], s["Type"]): s["ResourceRecords"][0]["Value"] for s in
               aws.route53.list_resource_record_sets(HostedZoneId=zone["Id"])[
                   "ResourceRecordSets"] if s["Name"].startswith("web-1.")}
    assert records == {("web-1.stateguard.test.", "A"): done["address"],
                       ("web-1.stateguard.test.", "TXT"): '"stateguard:run=run-1"'}

    effects = guard.journal.effects("run-1")  # type: ignore[attr-defined]
    assert [(e.node, e.effect.provider, e.effect.kind, e.effect.external_id) for e in effects] == [
        ("create_group", "ec2", "security_group", done["group_id"]),
        ("launch_instance", "ec2", "instance", done["instance_id"]),
        ("attach_address", "ec2", "elastic_ip", done["allocation_id"]),
        ("create_record", "route53", "dns_record", "web-1.stateguard.test. A run-1")]
    assert all(e.effect.idempotency_key.startswith("sg-effect-") for e in effects)

    # A second server goes in the same zone, made once.
    run(guard, graph, "run-2", name="db-2")
    assert aws.live() == {k: sorted(server("web-1")[k] + server("db-2")[k]) for k in NOTHING}
    assert len(aws.route53.list_hosted_zones()["HostedZones"]) == 1


@pytest.mark.parametrize("failed", NODES)
def test_it_removes_exactly_what_it_made_when_a_step_fails(aws: AwsWorld, failed: str) -> None:
    guard, graph = in_memory(aws.settings)
    run(guard, graph, "run-1", name="keep-1")  # another run's server, which must stay

    with pytest.raises(SagaAborted) as caught:
        run(guard, graph, "run-2", name="web-2", fail_at=failed)

    assert aws.live() == server("keep-1")  # nothing of web-2 is left, keep-1 is whole
    made = NODES[:NODES.index(failed)]
    # The failed step's compensation runs too (it checks before it acts), and finds nothing.
    assert undone(caught.value) == [(failed, "nothing_to_undo")] + [
        (node, "succeeded") for node in reversed(made)]
    # In the ledger: each part made, then its removal, newest first; each part compensated.
    effects = guard.journal.effects("run-2")  # type: ignore[attr-defined]
    kinds = ["security_group", "instance", "elastic_ip", "dns_record"][:len(made)]
    made_ids = [e.effect.external_id for e in effects[:len(made)]]
    assert ledger(guard, "run-2") == [(kind, "compensated", "") for kind in kinds] + list(zip(
        UNDO_KINDS[len(UNDO_KINDS) - len(made):], ["compensated"] * len(made),
        reversed(made_ids), strict=True))
    # An instance was launched only where the run got that far, and only once.
    assert aws.instances(alive=False) == ["keep-1"] + (["web-2"] if len(made) > 1 else [])


def test_an_operators_compensate_removes_a_provisioned_server(aws: AwsWorld) -> None:
    guard, graph = in_memory(aws.settings)
    run(guard, graph, "run-1", name="web-1")

    report = guard.compensate(graph, {"configurable": {"thread_id": "run-1"}})

    assert [(c.node, str(c.status)) for c in report.outcomes] == [
        (node, "succeeded") for node in reversed(NODES)]
    assert aws.live() == NOTHING
    assert [s for _, s, _ in ledger(guard, "run-1")] == ["compensated"] * 8
    # Once removed, the name is free for a new run, and a second compensate finds nothing.
    run(guard, graph, "run-2", name="web-1")
    assert aws.owners() == {"web-1": {"run-2"}}


def test_it_refuses_a_deployment_that_gives_it_no_aws_or_a_bad_option(aws: AwsWorld) -> None:
    with pytest.raises(ConfigurationError, match="gives it no AWS settings"):
        registry.get("provision", AgentSettings(stripe_api_key="", stripe_api_base="",
                                                sandbox_dir=Path("/nonexistent")))
    with pytest.raises(ConfigurationError, match="zone 'not a zone' is not a DNS name"):
        provision(aws.settings, zone="not a zone")
    with pytest.raises(ConfigurationError, match=r"unknown options \['size'\]"):
        provision(aws.settings, size=1)
    with pytest.raises(ConfigurationError, match="image_id 'ubuntu' is not an AMI id"):
        provision(aws.settings, image_id="ubuntu")


def test_with_aws_itself_and_no_image_its_first_step_refuses_before_any_call() -> None:
    # A deployment that never runs provision need not name an image: the agent builds (so
    # manage.py check passes), and a run says what to set before it calls AWS at all.
    real = AwsSettings(region="eu-west-1", endpoint_url=None, access_key_id=None,
                       secret_access_key=None)
    assert provision(real).name == "provision"
    agent = Provisioner(real, image_id=None, zone="stateguard.test")
    with pytest.raises(ProvisioningFailed, match="names no AMI to launch: set STATEGUARD_AGE"):
        agent.create_group({"name": "web-1"}, {"configurable": {"thread_id": "run-1"}})
    assert "ec2" not in agent.__dict__  # no client was even made
