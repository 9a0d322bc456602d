"""POST /api/runs/{code}/retry with ``from_step``: retry from an earlier step. A worker (here, the
task run in this process, as a worker would) undoes that step and the ones after it, newest
first, once, then runs the agent again from before it with the operator's update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from stateguard_web.accounts import services as accounts
from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import AuditEvent, Compensation, Run, Step
from tests.agents.provision_support import server
from tests.aws_world import AwsWorld
from tests.web.api.world import make_user
from tests.web.conftest import ledger

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _sandbox_here(sandbox: Path, settings: Any) -> None:
    settings.STATEGUARD_SANDBOX_DIR = str(sandbox)  # the agents of this process use it


@pytest.fixture
def operator() -> Client:
    charlie = make_user("charlie", "operator")
    _, key = accounts.api_key_create(user=charlie, name="charlie")
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def held_run(name: str) -> Run:
    """A provision run whose last step (create_record, step 4) failed and was held for an
    operator: group, instance and address made, nothing undone."""
    run = services.run_submit(agent="provision", input={
        "name": name, "fail_at": "create_record", "hold_failure": True})
    tasks.run_execute(run.pk)  # in this process, as a worker would
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED, run.error
    return run


def retry(client: Client, run: Run, body: Any) -> Any:
    return client.post(f"/api/runs/{run.code}/retry", body, content_type="application/json")


def carry_out(run: Run) -> None:
    run.refresh_from_db()
    tasks.run_request(run.pk, run.request["id"])  # the worker's task, in this process
    run.refresh_from_db()


def test_it_undoes_steps_three_and_two_once_and_runs_again_from_two(
        operator: Client, aws: AwsWorld) -> None:
    run = held_run("web-7")
    assert ledger(run) == ["security_group", "instance", "elastic_ip"]
    first = set(run.effects.values_list("external_id", flat=True))

    response = retry(operator, run, {"from_step": "launch_instance",
                                     "update": {"fail_at": None}})

    assert response.status_code == 202, response.json()
    request = response.json()["request"]
    assert (request["action"], request["node"], request["update"]) == (
        "retry_from", "launch_instance", {"fail_at": None})
    # Two operators a moment apart: the second is refused while the first waits.
    again = retry(operator, run, {"from_step": "launch_instance",
                                  "update": {"fail_at": None}})
    assert (again.status_code, again.json()["code"]) == (409, "not_allowed_now")
    request_id = response.json()["request"]["id"]
    carry_out(run)
    tasks.run_request(run.pk, request_id)  # a duplicate delivery: nothing to do

    assert run.status == Run.Status.SUCCEEDED, run.error
    # The address, then the instance, removed once, newest first; both made again; the group
    # kept; and in AWS one server, its first instance terminated.
    assert ledger(run) == ["security_group", "instance", "elastic_ip", "release", "termination",
                           "instance", "elastic_ip", "dns_record"]
    assert aws.live() == server("web-7") and aws.instances(alive=False) == ["web-7"] * 2
    again_made = run.effects.filter(kind__in=["instance", "elastic_ip"]).exclude(
        external_id__in=first)
    assert again_made.count() == 2 and {e.status for e in again_made} == {"applied"}
    rewound = Step.objects.filter(run=run, status=Step.Status.REWOUND)
    assert sorted(rewound.values_list("node", flat=True)) == [
        "attach_address", "create_record", "launch_instance"]
    assert AuditEvent.objects.filter(run=run, action="run.retry_from_requested").count() == 1

    detail = operator.get(f"/api/runs/{run.code}").json()
    assert [s["status"] for s in detail["steps"]].count("rewound") == 3


def test_it_refuses_across_a_pivot_and_names_it(operator: Client, sandbox: Path) -> None:
    run = held_run("web-8")
    Step.objects.filter(run=run, node="attach_address").update(kind="pivot")

    response = retry(operator, run, {"from_step": "launch_instance"})

    assert (response.status_code, response.json()["code"]) == (409, "not_allowed_now")
    assert "passed its pivot 'attach_address'" in response.json()["detail"]
    run.refresh_from_db()
    assert run.request is None and not Compensation.objects.filter(run=run).exists()
    # From the step after the pivot, there is none in between.
    assert retry(operator, run, {"from_step": "create_record"}).status_code == 202


def test_it_answers_a_bad_step_or_update_with_422(operator: Client, sandbox: Path) -> None:
    run = held_run("web-9")
    cases = [({"from_step": "nope"}, "no step 'nope'"),
             ({"from_step": "launch_instance", "update": {"bogus": 1}}, "not keys of"),
             ({"update": {"fail_at": None}}, "name the step"),
             ({"from_step": ""}, "at least 1"),
             ({"from_step": "launch_instance", "update": [1]}, "valid dictionary"),
             ({"from_step": "launch_instance", "extra": 1}, "Extra inputs")]
    for body, message in cases:
        response = retry(operator, run, body)
        assert response.status_code == 422, (body, response.content)
        assert message in response.json()["detail"], (body, response.json())
    run.refresh_from_db()
    assert run.request is None and run.status == Run.Status.FAILED
