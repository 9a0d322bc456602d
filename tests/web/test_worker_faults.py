"""Real Celery workers that die, stall or have their clock off, and the one that takes over
(``sagas/journal/leases.py``): a dead worker's run is recovered within a sweep, a stopped one
keeps its run, and no clock but the database's judges a lease."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

from stateguard_web.runs import services
from stateguard_web.sagas.journal.leases import db_now
from stateguard_web.sagas.models import AuditEvent, Compensation, Run
from tests.agents.provision_support import NOTHING, server
from tests.aws_world import AwsWorld
from tests.web.conftest import AGENT_INPUTS, Workers, ledger, wait_for
from tests.web.test_workers import finished, next_nodes

HOLD_CHARGE = b"POST /v1/payment_intents"


def recoveries(run: Run) -> int:
    return AuditEvent.objects.filter(run=run, action="run.recovering").count()


def test_it_recovers_a_killed_workers_run_without_waiting_for_its_lease(
        workers: Workers, aws: AwsWorld) -> None:
    # A lease far longer than detection takes (unless P4 reruns it with the defaults,
    # STATEGUARD_TEST_LEASE=10,3,2: docs/benchmarks.md).
    if "STATEGUARD_TEST_LEASE" not in os.environ:
        workers.env.update(STATEGUARD_LEASE_SECONDS="30", STATEGUARD_LEASE_RENEW_SECONDS="10")
    lease = int(workers.env["STATEGUARD_LEASE_SECONDS"])
    doomed = workers.start("doomed")
    run = services.run_submit(agent="provision", input={
        "name": "api-3", "sleep_at": "attach_address", "sleep_seconds": 60})
    # The checkpoint that names attach_address next is saved before its body starts (sync
    # durability), and the body sleeps a minute before its effect: kill the worker there.
    wait_for(lambda: next_nodes(run) == ("attach_address",), 60,
             "the worker to go on into attach_address", workers.logs)
    workers.start("rescuer", beat=True)
    workers.wait_ready("rescuer")
    run.refresh_from_db()
    assert run.lease_lock is not None  # the lease names the doomed process's lock
    workers.kill(doomed)
    killed_at = time.time()
    wait_for(lambda: finished(run), 60, "recovery to unwind the run", workers.logs)

    recovery = AuditEvent.objects.get(run=run, action="run.recovering")
    started_after = recovery.created_at.timestamp() - killed_at
    print(f"P4: recovery started {started_after:.1f} s after SIGKILL (lease, renew, sweep = "
          f"{lease}, {workers.env['STATEGUARD_LEASE_RENEW_SECONDS']}, "
          f"{workers.env['STATEGUARD_SWEEP_SECONDS']} s)")
    assert started_after < min(lease / 2, 8)  # P4: at most 8 s, well before the lease runs out
    assert run.status == Run.Status.COMPENSATED
    # Each effect happened once and was undone once; the step in doubt (killed before it
    # allocated anything) had nothing to undo.
    assert ledger(run) == ["security_group", "instance", "termination", "deletion"]
    assert aws.live() == NOTHING and aws.instances(alive=False) == ["api-3"]
    comp = Compensation.objects.get(run=run, node="attach_address")
    assert comp.status == Compensation.Status.NOTHING_TO_UNDO


def _stall_mid_charge(pool: Workers, relay: Any, seconds: float, **env: str
                      ) -> tuple[Run, Any]:
    """A checkout whose worker is stopped (SIGSTOP) right after Stripe charged, before it
    hears so, for ``seconds`` while a rescuer with beat sweeps; then let go (SIGCONT)."""
    held = relay.hold_answer(HOLD_CHARGE)
    stalled = pool.start("stalled", env=env)
    run = services.run_submit(agent="checkout", input=AGENT_INPUTS["checkout"])
    wait_for(held.reached.is_set, 60, "Stripe to charge", pool.logs)
    pool.start("rescuer", beat=True)
    pool.wait_ready("rescuer")
    os.killpg(stalled.pid, signal.SIGSTOP)  # the whole worker: its heartbeat thread too
    try:
        relay.release()  # Stripe's answer waits in the stopped worker's socket
        run.refresh_from_db()
        token = run.fencing_token
        time.sleep(seconds)
        run.refresh_from_db()
        return run, token
    finally:
        os.killpg(stalled.pid, signal.SIGCONT)


def charges(stripe_client: Any) -> list[tuple[int, int]]:
    return [(c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data]


def test_it_leaves_a_stopped_worker_its_run_past_its_lease(
        pool: Workers, relay: Any, stripe_client: Any) -> None:
    lease = int(pool.env["STATEGUARD_LEASE_SECONDS"])
    run, token = _stall_mid_charge(pool, relay, 3 * lease)

    # Stopped three leases long, swept every second: its process lives, so no takeover.
    assert run.lease_expires_at is not None and run.status == Run.Status.RUNNING
    assert (recoveries(run), run.fencing_token) == (0, token)
    wait_for(lambda: finished(run), 60, "the stalled worker to finish the run", pool.logs)
    assert (run.status, recoveries(run)) == (Run.Status.SUCCEEDED, 0)
    amount = AGENT_INPUTS["checkout"]["amount"]
    assert charges(stripe_client) == [(amount, 0)]  # charged once, never refunded


def test_it_fences_a_stopped_worker_out_once_the_lease_alone_gave_its_run_away(
        pool: Workers, relay: Any, stripe_client: Any) -> None:
    # Without its process lock (STATEGUARD_WORKER_LOCK off: the lease alone, as on SQLite),
    # a worker stopped past its lease loses the run: recovery unwinds it, and what the stopped
    # worker does when it wakes is refused, so no effect happens twice.
    lease = int(pool.env["STATEGUARD_LEASE_SECONDS"])
    run, token = _stall_mid_charge(pool, relay, 3 * lease, STATEGUARD_WORKER_LOCK="false")

    assert recoveries(run) == 1 and run.fencing_token > token
    wait_for(lambda: finished(run), 60, "recovery to unwind the run", pool.logs)
    wait_for(lambda: "was taken over by another worker" in (
        pool.log_dir / "stalled.log").read_text(), 30, "the stalled worker to be fenced out",
        pool.logs)
    assert run.status == Run.Status.COMPENSATED
    amount = AGENT_INPUTS["checkout"]["amount"]
    assert charges(stripe_client) == [(amount, amount)]  # charged once, refunded once
    assert len(stripe_client.v1.refunds.list().data) == 1


def test_it_judges_leases_by_the_database_clock_not_a_workers(
        workers: Workers, aws: AwsWorld) -> None:
    # The holder's clock is 30 s behind, the sweeper's 30 s ahead, and the holder has no
    # process lock (the lease alone protects it). Judged by either worker's clock, its lease
    # would have run out long ago; by the database's it never does.
    lease = int(workers.env["STATEGUARD_LEASE_SECONDS"])
    # And a run whose lease did run out (by the database's clock), of an agent no longer
    # offered: the sweeper takes it over and parks it, so it did sweep with its clock ahead.
    expired = Run.objects.create(agent="retired", status=Run.Status.RUNNING, lease_owner="x",
                                 lease_expires_at=db_now() - timedelta(seconds=1))
    workers.start("behind", clock_offset=-30, env={"STATEGUARD_WORKER_LOCK": "false"})
    run = services.run_submit(agent="provision", input={
        "name": "skew-1", "sleep_at": "attach_address", "sleep_seconds": 3 * lease + 6})
    wait_for(lambda: next_nodes(run) == ("attach_address",), 60,
             "the worker to go on into attach_address", workers.logs)
    workers.start("ahead", beat=True, clock_offset=30)
    wait_for(lambda: Run.objects.filter(pk=expired.pk, status=Run.Status.NEEDS_ATTENTION)
             .exists(), 60, "the sweeper ahead to park the expired run", workers.logs)
    run.refresh_from_db()  # swept while the behind worker still runs its run: not taken
    assert (run.status, recoveries(run)) == (Run.Status.RUNNING, 0), "slept too short"
    wait_for(lambda: finished(run), 60, "the run to finish", workers.logs)

    assert (run.status, recoveries(run), run.fencing_token) == (Run.Status.SUCCEEDED, 0, 1)
    assert ledger(run) == ["security_group", "instance", "elastic_ip", "dns_record"]
    assert aws.live() == server("skew-1") and aws.instances(alive=False) == ["skew-1"]
