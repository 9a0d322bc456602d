"""The provision agent when AWS fails now and then (issue 22, fault 1): a step whose call failed
without a verdict runs again and makes nothing twice; a compensation whose removal's answer was
lost finds the part gone on its next attempt and says so in the ledger.

Through a relay in front of moto's server that fails the requests it is told to."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from agents.registry import AwsSettings
from tests.agents.provision_support import NODES, NOTHING, in_memory, ledger, run, server
from tests.aws_world import AwsWorld
from tests.web.stripe_relay import StripeRelay


@pytest.fixture
def relay(aws: AwsWorld) -> Iterator[StripeRelay]:
    assert aws.settings.endpoint_url is not None
    relay = StripeRelay(aws.settings.endpoint_url)
    yield relay
    relay.close()


def through(aws: AwsWorld, relay: StripeRelay) -> AwsSettings:
    return replace(aws.settings, endpoint_url=relay.url)


def test_it_launches_one_instance_when_a_lookup_failed_and_the_launchs_answer_was_lost(
        aws: AwsWorld, relay: StripeRelay) -> None:
    failed = relay.fail(b"POST / ", 1, containing=b"Action=DescribeInstances")  # a 500
    lost = relay.cut(b"POST / ", 1, containing=b"Action=RunInstances")  # AWS launched it
    guard, graph = in_memory(through(aws, relay))

    run(guard, graph, "run-1", name="web-1")

    assert failed.seen == lost.seen == 1
    assert aws.live() == server("web-1")
    assert aws.instances(alive=False) == ["web-1"]  # launched once: the lookup found it
    attempts = {s.node: s.attempt for s in guard.status("run-1").steps}
    assert attempts == {"create_group": 1, "launch_instance": 3, "attach_address": 1,
                        "create_record": 1}


def test_it_records_the_removals_whose_answers_an_earlier_attempt_lost(
        aws: AwsWorld, relay: StripeRelay) -> None:
    guard, graph = in_memory(through(aws, relay))
    run(guard, graph, "run-1", name="web-1")
    cuts = [relay.cut(b"POST / ", 1, containing=b"Action=" + action)
            for action in (b"TerminateInstances", b"ReleaseAddress", b"DeleteSecurityGroup")]
    cuts.append(relay.cut(b"POST /2013-04-01/hostedzone/", 1,
                          containing=b"<Action>DELETE</Action>"))

    report = guard.compensate(graph, {"configurable": {"thread_id": "run-1"}})

    assert [rule.seen for rule in cuts] == [1, 1, 1, 1]  # AWS removed each; the answer lost
    assert [(c.node, str(c.status)) for c in report.outcomes] == [
        (node, "succeeded") for node in reversed(NODES)]
    assert [c.attempts for c in report.outcomes] == [2, 2, 2, 2]  # the second found it gone
    assert aws.live() == NOTHING
    # The ledger says what AWS does: each part removed, once.
    assert [s for _, s, _ in ledger(guard, "run-1")] == ["compensated"] * 8
