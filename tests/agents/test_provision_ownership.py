"""The provision agent's compensations remove only what their own run made (issue 8, item 9;
issue 21): every resource is tagged with its run when it is made, and found by that tag, also
when the step that made it died before its result was saved. A name is one run's at a time;
what no run owns (made by hand) is never adopted nor removed. Counted through the AWS API."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from agents.provision import NameTaken, NotOwned, Provisioner
from stateguard import RunLocked, SagaAborted, SqliteJournal, StateGuardCheckpointer
from tests import forked
from tests.agents.provision_support import (
    NODES,
    NOTHING,
    agent_spec,
    in_memory,
    ledger,
    run,
    server,
    undone,
)
from tests.aws_world import AwsWorld


def test_a_second_run_for_a_name_fails_before_any_effect_and_removes_nothing(
        aws: AwsWorld) -> None:
    guard, graph = in_memory(aws.settings)
    first = run(guard, graph, "run-1", name="web-1")

    with pytest.raises(SagaAborted) as caught:  # the same request again, by another run
        run(guard, graph, "run-2", name="web-1")

    assert isinstance(caught.value.cause, NameTaken)
    assert str(caught.value.cause) == ("web-1 is provisioned by run run-1: compensate that run "
                                       "to remove it, or choose another name")
    # Its first step failed before any effect; its compensation, which looks before it acts,
    # found nothing of its own run.
    assert undone(caught.value) == [("create_group", "nothing_to_undo")]
    assert aws.live() == server("web-1") and aws.owners() == {"web-1": {"run-1"}}
    assert ledger(guard, "run-2") == []
    [address] = aws.ec2.describe_addresses()["Addresses"]
    assert address["PublicIp"] == first["address"]


def test_a_compensation_never_removes_another_runs_resources(aws: AwsWorld) -> None:
    guard, graph = in_memory(aws.settings)
    run(guard, graph, "run-1", name="web-1")
    agent = Provisioner(aws.settings, image_id="ami-12c6146b", zone="stateguard.test")

    # Each compensation, for web-1 but another run: it finds nothing tagged with its run.
    def ctx(run_id: str) -> Any:
        return SimpleNamespace(run_id=run_id)

    for undo in (agent.delete_record, agent.release_address, agent.terminate_instance,
                 agent.delete_group):
        assert undo({"name": "web-1"}, ctx("run-2")) is False
    assert aws.live() == server("web-1")

    # An operator's compensate of another run (db-2) removes db-2, and web-1 stays whole.
    run(guard, graph, "run-2", name="db-2")
    guard.compensate(graph, {"configurable": {"thread_id": "run-2"}})
    assert aws.live() == server("web-1") and aws.owners() == {"web-1": {"run-1"}}


def test_it_never_adopts_a_security_group_that_no_run_owns(aws: AwsWorld) -> None:
    made = aws.ec2.create_security_group(GroupName="stateguard-web-1",
                                         Description="made by hand")["GroupId"]
    guard, graph = in_memory(aws.settings)

    with pytest.raises(SagaAborted) as caught:
        run(guard, graph, "run-1", name="web-1")

    assert isinstance(caught.value.cause, NotOwned)
    assert str(caught.value.cause) == (f"a security group stateguard-web-1 ({made}) exists "
                                       "that no run owns: it was made by hand; remove it or "
                                       "choose another name")
    assert undone(caught.value) == [("create_group", "nothing_to_undo")]
    assert [g["GroupId"] for g in aws._groups()] == [made]  # still there
    aws.ec2.delete_security_group(GroupId=made)  # the operator removes it: the name is free
    run(guard, graph, "run-2", name="web-1")
    assert aws.owners() == {"web-1": {"run-2"}}


def test_it_never_adopts_nor_removes_a_dns_record_that_no_run_owns(aws: AwsWorld) -> None:
    guard, graph = in_memory(aws.settings)
    run(guard, graph, "run-0", name="other")  # the zone exists
    [zone] = aws.route53.list_hosted_zones()["HostedZones"]
    hand_made = {"Name": "web-1.stateguard.test.", "Type": "A", "TTL": 300,
                 "ResourceRecords": [{"Value": "192.0.2.7"}]}
    aws.route53.change_resource_record_sets(HostedZoneId=zone["Id"], ChangeBatch={
        "Changes": [{"Action": "CREATE", "ResourceRecordSet": hand_made}]})

    with pytest.raises(SagaAborted) as caught:
        run(guard, graph, "run-1", name="web-1")

    assert isinstance(caught.value.cause, NotOwned)
    assert str(caught.value.cause).startswith("web-1.stateguard.test. exists (192.0.2.7) and "
                                              "no run owns it")
    assert undone(caught.value) == [("create_record", "nothing_to_undo")] + [
        (node, "succeeded") for node in reversed(NODES[:3])]
    # run-1's own group, instance and address are gone; the hand-made record is as it was.
    assert aws.live() == {**server("other"), "records": ["other.stateguard.test.",
                                                         "web-1.stateguard.test."]}
    sets = aws.route53.list_resource_record_sets(HostedZoneId=zone["Id"])["ResourceRecordSets"]
    assert hand_made in sets


def crash(tmp_path: Path, thread: str, name: str, die_at: str, *, agent: str = "provision",
          data: dict[str, Any] | None = None) -> None:
    """Run ``agent`` (provision ``name``, or ``data``) in a process of its own that dies where
    ``die_at`` says (tests/agents/aws_procs.py)."""
    outputs = tmp_path / ".procs"
    proc = forked.start("tests.agents.aws_procs", str(tmp_path), thread, agent,
                        json.dumps(data or {"name": name}), die_at,
                        out=forked.new_file(outputs, ".out"),
                        err=forked.new_file(outputs, ".err"), env=dict(os.environ))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 137, err


def recover(tmp_path: Path, thread: str, aws: AwsWorld, *, resume: bool = False,
            agent: str = "provision") -> Any:
    """Recover the dead run as the sweeper would (unwind it, or with ``resume`` run it on);
    the report (or the final state), and the run's ledger."""
    spec = agent_spec(agent, aws.settings)
    with closing(sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)) as conn:
        guard = StateGuardCheckpointer(SqliteSaver(conn),
                                       journal=SqliteJournal(tmp_path / "journal.db"),
                                       **spec.guard_kwargs())
        graph = guard.compile(spec.build())
        config: Any = {"configurable": {"thread_id": thread}}
        deadline = time.monotonic() + 30
        while True:
            try:
                outcome = guard.recover(graph, config, resume=resume)
                break
            except RunLocked:  # the dead process's 1 s lease has not expired yet
                assert time.monotonic() < deadline
                time.sleep(0.1)
        return outcome, ledger(guard, thread)


@pytest.mark.slow
@pytest.mark.parametrize("die_at", ["ledger:elastic_ip", "finish:attach_address",
                                    "ledger:instance", "finish:create_record"])
def test_it_finds_and_removes_what_a_step_in_doubt_made_and_only_that(
        aws: AwsWorld, tmp_path: Path, die_at: str) -> None:
    guard, graph = in_memory(aws.settings)
    run(guard, graph, "run-1", name="web-1")  # another run's server

    # run-2 dies inside a step, after AWS made its part: the journal never learns its result
    # (with "ledger:", nor does the ledger), so the step is in doubt.
    crash(tmp_path, "run-2", "db-2", die_at)
    assert "db-2" in aws.owners() and aws.owners()["db-2"] == {"run-2"}
    report, effects = recover(tmp_path, "run-2", aws)

    assert not report.needs_attention
    in_doubt = {"elastic_ip": "attach_address", "instance": "launch_instance"}.get(
        die_at.partition(":")[2], die_at.partition(":")[2])
    done = [(c.node, str(c.status)) for c in report.outcomes]
    assert done[0] == (in_doubt, "succeeded")  # found by its run's tag, and removed
    assert all(status == "succeeded" for _, status in done)
    assert aws.live() == server("web-1") and aws.owners() == {"web-1": {"run-1"}}
    assert aws.instances(alive=False) == ["db-2", "web-1"]  # one launched, no more
    assert [kind for kind, _, _ in effects].count("termination") == 1
    # Each part removed is in the ledger, compensated, beside its removal: also the one the
    # step could not record ("ledger:", the ledger gap), recorded by the compensation that
    # found it by its run's tag.
    made = [kind for kind, _, undoes in effects if not undoes]
    assert {"ledger:elastic_ip": "elastic_ip", "ledger:instance": "instance",
            "finish:attach_address": "elastic_ip", "finish:create_record": "dns_record"}[
        die_at] in made
    assert len(made) * 2 == len(effects) and {s for _, s, _ in effects} == {"compensated"}


@pytest.mark.slow
def test_a_step_in_doubt_run_again_makes_nothing_twice(aws: AwsWorld, tmp_path: Path) -> None:
    # Resumed instead of unwound, the step in doubt runs again with the same idempotency key:
    # it finds the instance (the address) its first run made by that token, and makes none.
    crash(tmp_path, "run-1", "web-1", "finish:launch_instance")
    recover(tmp_path, "run-1", aws, resume=True)
    assert aws.live() == server("web-1") and aws.instances(alive=False) == ["web-1"]

    crash(tmp_path, "run-2", "db-2", "ledger:elastic_ip")
    recover(tmp_path, "run-2", aws, resume=True)
    assert aws.live() == {k: sorted(server("web-1")[k] + server("db-2")[k]) for k in NOTHING}
    assert len(aws.ec2.describe_addresses()["Addresses"]) == 2
