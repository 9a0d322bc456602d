"""Terminate with real Celery worker processes and the local AWS: a provision run waiting in a
slow step is stopped at the next step boundary and unwound, each part it made removed once;
and a worker killed after it learned of a terminate loses nothing (the request is on the run;
recovery carries it out as the operator chose, not as the agent's crash policy says)."""

from __future__ import annotations

import pytest

from stateguard_web.runs import services
from stateguard_web.sagas.models import AuditEvent, Compensation, Run
from tests.agents.provision_support import NOTHING
from tests.aws_world import AwsWorld
from tests.web.conftest import Workers, ledger, wait_for
from tests.web.test_workers import finished


def carried_out(run: Run) -> Run | None:
    """The run once it finished and its terminate was cleared (a write of its own, after)."""
    done = finished(run)
    return done if done is not None and done.request is None else None

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


def test_a_killed_worker_loses_no_terminate_and_a_live_one_stops_at_the_next_step(
        workers: Workers, aws: AwsWorld) -> None:
    # 1. A worker killed once it knows of a terminate ("hold"), in the middle of a slow step.
    #    The agent's crash policy would unwind the run; the operator asked to hold it: its
    #    security group stays, nothing is undone.
    doomed = workers.start("doomed")
    held = services.run_submit(agent="provision", input={
        "name": "api-h", "sleep_at": "launch_instance", "sleep_seconds": 60})
    wait_for(lambda: ledger(held) == ["security_group"], 60, "the run to reach its slow step",
             workers.logs)
    workers.start("w1", beat=True)  # it boots meanwhile; its sweep finds the run abandoned
    services.run_terminate(run=held, by="olivia", then="hold", reason="check the quota")
    wait_for(lambda: f"run {held.code} is to stop" in workers.logs(), 30,
             "the worker to learn of the terminate", workers.logs)
    workers.wait_ready("w1")
    workers.kill(doomed)
    wait_for(lambda: carried_out(held), 60, "recovery to carry the terminate out",
             workers.logs)

    assert held.status == Run.Status.NEEDS_ATTENTION and held.request is None
    assert "terminated by olivia: check the quota" in held.error["message"]
    assert ledger(held) == ["security_group"]
    assert aws.live() == {**NOTHING, "groups": ["api-h"]} and aws.instances(alive=False) == []
    assert not Compensation.objects.filter(run=held).exists()
    done = AuditEvent.objects.get(run=held, action="run.terminated")
    assert (done.actor, done.data["then"], done.data["status"]) == (
        "worker", "hold", "needs_attention")

    # 2. The live worker runs a run that sleeps in launch_instance: it learns of the terminate
    #    at its lease's next heartbeat; launch_instance finishes (its instance is made whole),
    #    attach_address never starts, and the run is unwound newest first, each part once.
    slow = services.run_submit(agent="provision", input={
        "name": "api-t", "sleep_at": "launch_instance", "sleep_seconds": 3})
    wait_for(lambda: ledger(slow) == ["security_group"], 60, "the run to reach its slow step",
             workers.logs)
    services.run_terminate(run=slow, by="olivia", then="unwind", reason="wrong size")
    wait_for(lambda: carried_out(slow), 60, "the run to be stopped and unwound", workers.logs)

    assert slow.status == Run.Status.COMPENSATED and slow.request is None
    assert ledger(slow) == ["security_group", "instance", "termination", "deletion"]
    assert aws.live() == {**NOTHING, "groups": ["api-h"]}
    assert aws.instances(alive=False) == ["api-t"]  # launched once, and terminated
    assert list(slow.steps.values_list("node", flat=True)) == ["create_group",
                                                               "launch_instance"]
    assert {c.triggered_by for c in Compensation.objects.filter(run=slow)} == {"olivia"}
    assert slow.error["type"] == "RunTerminated"
    assert list(AuditEvent.objects.filter(run=slow).order_by("pk").values_list(
        "action", flat=True)) == ["run.submitted", "run.terminate_requested", "run.terminated"]
