"""DjangoJournal: the core's saga guarantees on the Django models (PostgreSQL)."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import IntegrityError, connection
from django.db.models import ProtectedError
from django.test.utils import CaptureQueriesContext

from stateguard import (
    ApprovalStatus,
    CompensationRetry,
    InvalidRunState,
    Journal,
    RetryLater,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from stateguard_web.sagas.journal import DjangoJournal, LeaseLost
from stateguard_web.sagas.models import Approval, AuditEvent, Compensation, Run, Step
from tests.core.support import FAST_RETRY, config, line_builder, undo
from tests.web.conftest import new_run

pytestmark = pytest.mark.django_db(transaction=True)
NODES = ["a", "b", "c", "d"]


def test_it_implements_the_journal_protocol() -> None:
    assert isinstance(DjangoJournal(), Journal)


def test_it_journals_a_failed_saga_and_unwinds_it_in_reverse_order() -> None:
    effects: list[str] = []
    code = new_run()
    guard = StateGuardCheckpointer(journal=DjangoJournal(), compensation_retry=FAST_RETRY,
                                   compensations={n: undo(effects, n) for n in NODES})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "d"},
                     config(code))

    assert effects == ["a", "b", "c", "undo:c", "undo:b", "undo:a"]
    run = Run.objects.get(code=code)
    assert run.status == Run.Status.COMPENSATED and run.error["type"] == "ValueError"
    steps = {s.node: s for s in Step.objects.filter(run=run)}
    assert {n: s.status for n, s in steps.items()} == {
        "a": "succeeded", "b": "succeeded", "c": "succeeded", "d": "failed"}
    assert steps["c"].state_after["log"] == ["a", "b", "c"]
    comps = Compensation.objects.filter(run=run).order_by("attempts__finished_at")
    assert [c.node for c in comps] == ["c", "b", "a"]
    assert all(c.attempts.count() == 1 and c.status == "succeeded" for c in comps)
    assert run.lease_owner == ""  # released


def test_it_journals_every_attempt_of_a_failing_compensation() -> None:
    effects: list[str] = []
    code = new_run()

    def broken(state: object, ctx: object) -> bool:
        raise ConnectionError("refund API down")

    guard = StateGuardCheckpointer(journal=DjangoJournal(), compensation_retry=FAST_RETRY,
                                   compensations={"a": broken})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "b"},
                     config(code))
    comp = Compensation.objects.get(run__code=code)
    assert comp.status == "failed"
    assert [a.error["message"] for a in comp.attempts.all()] == ["refund API down"] * 3
    assert Run.objects.get(code=code).status == Run.Status.NEEDS_ATTENTION


def test_it_keeps_a_waiting_compensations_next_round_and_clears_it_when_it_is_done() -> None:
    """A compensation whose attempts are spent waits (RetryLater): the run stays compensating,
    the compensation waiting with the time of its next round; that round (recovery's, which
    the sweeper starts once the time has come: test_compensation_wait.py) undoes the step,
    and nothing waits any more."""
    down = [True]

    def refund(state: object, ctx: object) -> bool:
        if down[0]:
            raise ConnectionError("refund API down")
        return True

    code = new_run()
    retry = CompensationRetry(attempts=2, initial=0.001, cap=0.002,
                              later=RetryLater(initial=0.05, cap=0.05, budget=60))
    guard = StateGuardCheckpointer(journal=DjangoJournal(), compensations={"a": refund},
                                   compensation_retry=retry)
    graph = guard.compile(line_builder(NODES, []))
    before = time.time()
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "b"}, config(code))

    comp = Compensation.objects.get(run__code=code)
    assert Run.objects.get(code=code).status == Run.Status.COMPENSATING
    assert comp.status == "waiting" and comp.attempts.count() == 2
    assert before + 0.05 <= comp.retry_at.timestamp() <= time.time() + 0.05
    (record,) = DjangoJournal().compensations(code)
    assert record.retry_at == comp.retry_at.timestamp()

    down[0] = False
    guard.recover(graph, config(code))
    comp.refresh_from_db()
    assert (comp.status, comp.retry_at, comp.attempts.count()) == ("succeeded", None, 3)
    assert Run.objects.get(code=code).status == Run.Status.COMPENSATED


def test_it_fences_writes_from_a_worker_whose_lease_was_taken_over() -> None:
    code = new_run()
    slow, fast = DjangoJournal(), DjangoJournal()
    assert slow.lock_acquire(code, "worker-1", 0.05)
    slow.step_start(code, "t1", "a")
    assert not fast.lock_acquire(code, "worker-2", 10)  # still held
    time.sleep(0.06)
    assert fast.lock_acquire(code, "worker-2", 10)  # expired: taken over, token bumped
    with pytest.raises(LeaseLost):
        slow.step_finish(code, "t1", StepStatus.SUCCEEDED)
    with pytest.raises(LeaseLost):
        slow.run_set_status(code, RunStatus.SUCCEEDED)
    assert not slow.lock_acquire(code, "worker-1", 10)  # its heartbeat cannot win it back
    fast.step_finish(code, "t1", StepStatus.SUCCEEDED)
    run = Run.objects.get(code=code)
    assert (run.lease_owner, run.fencing_token) == ("worker-2", 2)
    assert Step.objects.get(run=run).status == "succeeded"


def test_it_decides_an_approval_once() -> None:
    from stateguard.records import ApprovalRecord

    code = new_run()
    journal = DjangoJournal()
    journal.approval_request(ApprovalRecord(code, "t1", "charge", payload={"amount": 5}))
    assert journal.approval_decide(code, "t1", ApprovalStatus.APPROVED, by="alice")
    assert not journal.approval_decide(code, "t1", ApprovalStatus.REJECTED, by="bob")
    (approval,) = journal.approvals(code)
    assert (approval.status, approval.decided_by) == (ApprovalStatus.APPROVED, "alice")


def test_it_keeps_one_pending_approval_per_run_and_node_in_the_database() -> None:
    run = Run.objects.create(agent="test")
    Approval.objects.create(run=run, step_id="t1", node="charge", requested_at=run.created_at)
    with pytest.raises(IntegrityError):
        Approval.objects.create(run=run, step_id="t2", node="charge",
                                requested_at=run.created_at)


def test_it_rejects_an_unknown_status_in_the_database() -> None:
    with pytest.raises(IntegrityError):
        Run.objects.create(agent="test", status="exploded")


def test_it_keeps_audit_events_append_only() -> None:
    event = AuditEvent.objects.create(actor="alice", action="run.approved")
    event.action = "run.rejected"
    with pytest.raises(ValueError):
        event.save()
    with pytest.raises(ValueError):
        event.delete()


def test_it_creates_a_run_for_a_thread_it_does_not_know() -> None:
    code = str(uuid.uuid4())
    record = DjangoJournal().run_begin(code)
    assert record.status == RunStatus.RUNNING and Run.objects.filter(code=code).exists()


def test_it_never_renews_a_lease_that_was_released_or_taken_over() -> None:
    code = new_run()
    stalled, recovery = DjangoJournal(), DjangoJournal()
    assert stalled.lock_acquire(code, "worker-1", 0.05)
    time.sleep(0.06)
    assert recovery.lock_acquire(code, "recovery", 10)
    recovery.lock_release(code, "recovery")
    assert not stalled.lock_renew(code, "worker-1", 10)
    with pytest.raises(LeaseLost):
        stalled.step_start(code, "t9", "charge")
    assert Run.objects.get(code=code).lease_owner == ""


def test_it_takes_every_status_list_from_the_core() -> None:
    from stateguard import records

    pairs = [(Run.Status, records.RunStatus), (Step.Status, records.StepStatus),
             (Compensation.Status, records.CompensationStatus),
             (Approval.Status, records.ApprovalStatus)]
    for choices, statuses in pairs:
        assert choices.values == [s.value for s in statuses]
    check = next(c for c in Run._meta.constraints if c.name == "sagas_run_status_valid")
    assert sorted(check.condition.children[0][1]) == sorted(s.value for s in records.RunStatus)


@pytest.mark.django_db
def test_it_keeps_the_effect_ledger_once_per_external_id_and_settles_charges() -> None:
    from stateguard import Effect as CoreEffect
    from stateguard import EffectStatus
    from stateguard.effects import EffectRecord
    from stateguard_web.sagas.models import Effect

    code = new_run()
    journal = DjangoJournal()
    charge = journal.effect_record(EffectRecord(
        code, "s1", "charge_user", CoreEffect("stripe", "charge", "pi_1", amount=5000,
                                              currency="usd", idempotency_key="k")))
    assert charge.status == EffectStatus.APPLIED
    journal.effect_record(EffectRecord(
        code, "s1", "charge_user", CoreEffect("stripe", "refund", "re_1", amount=2000,
                                              undoes="pi_1")))
    assert Effect.objects.get(external_id="pi_1").status == "partially_compensated"
    again = journal.effect_record(EffectRecord(  # found again by a reconciliation: no change
        code, "s9", "other", CoreEffect("stripe", "refund", "re_1", amount=9999, undoes="pi_1")))
    assert (again.step_id, again.effect.amount) == ("s1", 2000)
    journal.effect_record(EffectRecord(
        code, "s1", "charge_user", CoreEffect("stripe", "refund", "re_2", amount=3000,
                                              undoes="pi_1")))
    assert {e.effect.external_id: str(e.status) for e in journal.effects(code)} == {
        "pi_1": "compensated", "re_1": "compensated", "re_2": "compensated"}
    with pytest.raises(ProtectedError):  # money records outlive the journal's pruning
        Run.objects.filter(code=code).delete()


def test_it_reads_one_step_in_one_query_by_its_run_and_id() -> None:
    # A guarded tool call looks up its own step before it runs: one row, not every step of the
    # run with the state after each (an agent's state holds the whole conversation).
    code = new_run()
    journal = DjangoJournal()
    history = [{"role": "user", "content": "x" * 200}]
    for n in range(10):
        journal.step_start(code, f"t{n}", "reserve_seat", ("inventory",))
        history = [*history, {"role": "tool", "content": f"{n}A"}]
        journal.step_finish(code, f"t{n}", StepStatus.SUCCEEDED, update={"seat": f"{n}A"},
                            state_after={"messages": history})

    with CaptureQueriesContext(connection) as queries:
        step = journal.step_get(code, "t4")
    assert len(queries) == 1 and "step_id" in queries[0]["sql"]
    assert step == next(s for s in journal.steps(code) if s.step_id == "t4")
    assert step is not None and step.update == {"seat": "4A"} and step.done_seq == 5
    assert step.tags == ("inventory",) and step.status == StepStatus.SUCCEEDED
    assert journal.step_get(code, "t10") is None
    assert journal.step_get(str(uuid.uuid4()), "t4") is None  # no such run


def test_it_refuses_a_change_of_status_the_state_machine_does_not_allow() -> None:
    journal, code = DjangoJournal(), new_run()  # pending
    with pytest.raises(InvalidRunState, match="cannot go from pending to paused"):
        journal.run_set_status(code, RunStatus.PAUSED)
    assert Run.objects.get(code=code).status == Run.Status.PENDING  # nothing written
    Run.objects.filter(code=code).update(status=Run.Status.SUCCEEDED)
    journal.run_set_status(code, RunStatus.COMPENSATING)
    journal.run_set_status(code, RunStatus.COMPENSATED)
    with pytest.raises(InvalidRunState, match="from compensated to paused"):
        journal.run_set_status(code, RunStatus.PAUSED)
