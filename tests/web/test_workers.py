"""Real Celery worker processes run provision runs: end to end, failing, killed, duplicated."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from stateguard_web.runs import services, tasks
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run
from tests.agents.provision_support import NOTHING, server
from tests.aws_world import AwsWorld
from tests.web.conftest import Workers, held_keys, ledger, wait_for

DONE = {Run.Status.SUCCEEDED, Run.Status.COMPENSATED, Run.Status.NEEDS_ATTENTION}


def finished(run: Run) -> Run | None:
    run.refresh_from_db()
    return run if run.status in DONE else None


def next_nodes(run: Run) -> tuple[str, ...]:
    """The nodes the run's last saved checkpoint says run next."""
    from stateguard_web.runs.runtime import config_for, guard_for

    return tuple(guard_for(run.agent)[1].get_state(config_for(run.thread_id)).next)


async def receive(layer: Any, channel: str) -> dict[str, Any]:
    """A message on the channel, or a failed test after a while: never a hang."""
    return await asyncio.wait_for(layer.receive(channel), timeout=30)


def test_it_executes_a_run_end_to_end(workers: Workers, aws: AwsWorld) -> None:
    workers.start("w1")
    run = services.run_submit(agent="provision", input={"name": "web-1"}, by="alice")
    wait_for(lambda: finished(run), 60, "the run to finish", workers.logs)

    assert run.status == Run.Status.SUCCEEDED
    assert aws.live() == server("web-1") and aws.owners() == {"web-1": {str(run.code)}}
    assert ledger(run) == ["security_group", "instance", "elastic_ip", "dns_record"]
    assert list(run.steps.values_list("status", flat=True)) == ["succeeded"] * 4
    assert run.lease_owner == ""


def test_it_unwinds_a_failing_run_with_every_step_and_attempt_in_the_db(
        workers: Workers, aws: AwsWorld) -> None:
    workers.start("w1")
    run = services.run_submit(agent="provision", input={"name": "db-2",
                                                        "fail_at": "create_record"})
    wait_for(lambda: finished(run), 60, "the run to be unwound", workers.logs)

    assert run.status == Run.Status.COMPENSATED
    assert ledger(run) == ["security_group", "instance", "elastic_ip",
                           "release", "termination", "deletion"]
    assert set(run.effects.values_list("status", flat=True)) == {"compensated"}
    assert aws.live() == NOTHING and aws.instances(alive=False) == ["db-2"]
    assert dict(run.steps.values_list("node", "status")) == {
        "create_group": "succeeded", "launch_instance": "succeeded",
        "attach_address": "succeeded", "create_record": "failed"}
    # The failed create_record's compensation checks before it acts (in_doubt_safe), so it
    # may be given the failed step too: it finds no record of this run's.
    comps = Compensation.objects.filter(run=run).exclude(
        node="create_record", status=Compensation.Status.NOTHING_TO_UNDO).order_by(
        "attempts__started_at")
    assert [(c.node, c.status, c.attempts.count()) for c in comps] == [
        ("attach_address", "succeeded", 1), ("launch_instance", "succeeded", 1),
        ("create_group", "succeeded", 1)]


def test_it_removes_what_a_killed_workers_step_made_before_its_result_was_saved(
        workers: Workers, aws: AwsWorld) -> None:
    # The worker dies after AWS made the address, before the step's result was saved: the
    # step is in doubt, and its compensation finds the address by the run's tag.
    doomed = workers.start("doomed")
    run = services.run_submit(agent="provision", input={
        "name": "api-4", "sleep_at": "attach_address", "sleep_seconds": 60,
        "sleep_after_effect": True})
    # Killed once the address is made and in the ledger (the step records it right after
    # AllocateAddress returns: a kill between the two was a race this test lost now and then).
    wait_for(lambda: aws.live()["addresses"] == ["api-4"] and "elastic_ip" in ledger(run), 60,
             "the worker to allocate the address and record it", workers.logs)
    workers.kill(doomed)
    workers.start("rescuer", beat=True)
    wait_for(lambda: finished(run), 60, "recovery to unwind the run", workers.logs)

    assert run.status == Run.Status.COMPENSATED
    assert run.steps.get(node="attach_address").status == "started"  # never saved
    assert aws.live() == NOTHING and aws.instances(alive=False) == ["api-4"]
    assert Compensation.objects.get(run=run, node="attach_address").status == (
        Compensation.Status.SUCCEEDED)
    assert ledger(run) == ["security_group", "instance", "elastic_ip", "release",
                           "termination", "deletion"]


def test_it_runs_a_run_once_when_two_workers_are_handed_it(
        workers: Workers, aws: AwsWorld) -> None:
    run = services.run_submit(agent="provision", input={
        "name": "dup-4", "sleep_at": "create_group", "sleep_seconds": 1})
    tasks.run_execute.delay(run.pk)  # the broker delivers the run a second time
    workers.start("w1")
    workers.start("w2")
    wait_for(lambda: finished(run), 60, "the run to finish", workers.logs)
    # Both deliveries were taken up and are done: nothing can run after this.
    wait_for(lambda: workers.logs().count("run_execute[") >= 4, 60,
             "both deliveries to be received and done", workers.logs)

    assert run.status == Run.Status.SUCCEEDED
    assert aws.live() == server("dup-4") and aws.instances(alive=False) == ["dup-4"]
    assert ledger(run) == ["security_group", "instance", "elastic_ip", "dns_record"]


def test_it_publishes_journal_changes_to_the_run_and_all_runs_groups(
        workers: Workers, sandbox: Path) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from stateguard_web.sagas.events import ALL_RUNS_GROUP, run_group

    layer = get_channel_layer()
    run = services.run_submit(agent="provision", input={"name": "live-5"})  # queued
    listeners = {}
    for group in (ALL_RUNS_GROUP, run_group(str(run.code))):
        channel = async_to_sync(layer.new_channel)()
        async_to_sync(layer.group_add)(group, channel)
        listeners[group] = channel
    workers.start("w1")
    wait_for(lambda: finished(run), 60, "the run to finish", workers.logs)
    assert run.status == Run.Status.SUCCEEDED

    for group, channel in listeners.items():
        seen: list[tuple[str, str | None]] = []
        while ("run.status", None) not in seen[-1:] or len(seen) < 9:
            message = async_to_sync(receive)(layer, channel)
            assert message["type"] == "run.events"
            seen += [(e["type"], e["node"]) for e in message["events"]
                     if e["run"] == str(run.code)]
        assert ("step.started", "create_group") in seen, group
        assert ("step.succeeded", "create_record") in seen, group
        assert seen.index(("step.started", "create_group")) < seen.index(
            ("step.succeeded", "create_record"))


def test_it_pauses_for_approval_and_resumes_in_a_worker_after_the_operator_approves(
        workers: Workers, sandbox: Path, stripe_client: object, localstripe_url: str) -> None:
    workers.env.update(STRIPE_API_BASE=localstripe_url, STRIPE_API_KEY="sk_test_stateguard")
    workers.start("w1")
    big = {"email": "alice@example.com", "amount": 250_00}
    approved = services.run_submit(agent="checkout", input=big)
    rejected = services.run_submit(agent="checkout", input=big)
    for run in (approved, rejected):
        wait_for(lambda run=run: (run.refresh_from_db(), run.status == Run.Status.PAUSED)[1],
                 60, "the run to pause for approval", workers.logs)

    services.run_approve(run=approved, by="alice")
    services.run_reject(run=rejected, by="bob", reason="looks like fraud")
    wait_for(lambda: finished(approved) and finished(rejected), 60, "both runs to end",
             workers.logs)

    assert (approved.status, rejected.status) == (Run.Status.SUCCEEDED, Run.Status.COMPENSATED)
    charges = stripe_client.v1.charges.list().data  # type: ignore[attr-defined]
    assert [(c.amount, c.amount_refunded) for c in charges] == [(250_00, 0)]  # one charge
    decided = {a.run_id: (a.status, a.decided_by) for a in
               Approval.objects.filter(run__in=[approved, rejected])}
    assert decided == {approved.pk: ("approved", "alice"), rejected.pk: ("rejected", "bob")}
    assert AuditEvent.objects.filter(run=rejected, action="run.rejected").exists()


def test_it_keeps_its_database_connections_between_runs_and_replaces_dropped_ones(
        workers: Workers, sandbox: Path) -> None:
    """Opening a connection per task cost more than a run's journal writes (P2)."""
    from django.db import connection

    def backends() -> set[tuple[int, str]]:
        with connection.cursor() as cursor:
            # This test database's: other suites (xdist workers) run workers of their own.
            cursor.execute("SELECT pid, backend_start::text FROM pg_stat_activity WHERE "
                           "application_name = 'stateguard-worker' AND "
                           "datname = current_database()")
            return set(cursor.fetchall())

    def run_one(name: str) -> Run:
        run = services.run_submit(agent="provision", input={"name": name})
        wait_for(lambda: finished(run), 60, f"run {name} to finish", workers.logs)
        return run

    workers.start("w1")
    run_one("conn-1")
    before = backends()
    for i in (2, 3, 4):
        last = run_one(f"conn-{i}")
    # The same connections, not one per run: none replaced, and no new one per run (a
    # connection a process opens lazily, its first heartbeat's say, may join under load).
    now = backends()
    assert before and before <= now and len(now - before) < 3, (before, now)

    with connection.cursor() as cursor:  # what a database restart does to the worker
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                       "datname = current_database() AND pid <> pg_backend_pid()")
    after = run_one("conn-5")
    assert after.status == Run.Status.SUCCEEDED
    # Its process lock went with the old session: the new lease names a new one, held.
    assert last.lease_lock is not None and after.lease_lock not in (None, last.lease_lock)
    assert after.lease_lock in held_keys()


def test_two_workers_journal_every_step_of_many_runs_once_and_in_order(
        workers: Workers, sandbox: Path) -> None:
    """Step rows ride the checkpoint writes of two processes at once: none lost, none doubled."""
    from django.test import override_settings

    workers.env["STATEGUARD_BENCH_AGENTS"] = "true"  # noop5 is a benchmark agent
    with override_settings(STATEGUARD_BENCH_AGENTS=True):
        runs = [services.run_submit(agent="noop5", input={"n": 0}) for _ in range(20)]
    workers.start("w1")
    workers.start("w2")
    for run in runs:
        wait_for(lambda run=run: finished(run), 60, "the runs to finish", workers.logs)

    for run in runs:
        assert (run.status, run.lease_owner) == (Run.Status.SUCCEEDED, "")
        rows = list(run.steps.order_by("done_seq").values_list("node", "status", "attempt",
                                                                "done_seq"))
        assert rows == [(f"step{i}", "succeeded", 1, i) for i in range(1, 6)]
        assert [s["n"] for s in run.steps.order_by("done_seq").values_list(
            "state_after", flat=True)] == [1, 2, 3, 4, 5]
