"""Step rows and the fence travel with LangGraph's checkpoint writes (PostgreSQL, ``step_rows``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from langgraph.graph import START, StateGraph

from stateguard import RunStatus, SagaAborted, StateGuardCheckpointer, StepStatus
from stateguard_web.sagas import runtime
from stateguard_web.sagas.checkpoints import JournalingPostgresSaver
from stateguard_web.sagas.journal import DjangoJournal, LeaseLost
from stateguard_web.sagas.models import Run, Step
from tests.core.support import FAST_RETRY, config, line_builder, undo

pytestmark = pytest.mark.django_db(transaction=True)
NODES = ["a", "b", "c", "d"]


def deferring() -> tuple[DjangoJournal, JournalingPostgresSaver]:
    journal = DjangoJournal(defer_steps=True)
    return journal, JournalingPostgresSaver(runtime.checkpoint_pool(), journal)


def checkpoint_rows(code: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %s)"
                       " + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s)",
                       [code, code])
        return int(cursor.fetchone()[0])


def test_it_writes_each_step_row_with_the_checkpoint_and_unwinds_from_them() -> None:
    effects: list[str] = []
    journal, saver = deferring()
    code = str(Run.objects.create(agent="test").code)
    guard = StateGuardCheckpointer(saver, journal=journal, compensation_retry=FAST_RETRY,
                                   compensations={n: undo(effects, n) for n in NODES})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(line_builder(NODES, effects)), {"fail_at": "d"},
                     config(code))

    assert effects == ["a", "b", "c", "undo:c", "undo:b", "undo:a"]
    run = Run.objects.get(code=code)
    assert (run.status, run.lease_owner) == (Run.Status.COMPENSATED, "")
    steps = list(Step.objects.filter(run=run).order_by("started_at"))
    assert [(s.node, s.status, s.attempt, s.done_seq) for s in steps] == [
        ("a", "succeeded", 1, 1), ("b", "succeeded", 1, 2), ("c", "succeeded", 1, 3),
        ("d", "failed", 1, None)]
    assert steps[2].state_after["log"] == ["a", "b", "c"]
    assert steps[3].error["type"] == "ValueError"


def test_it_marks_a_run_running_with_its_first_checkpoint() -> None:
    journal, saver = deferring()
    code = str(Run.objects.create(agent="test").code)
    assert journal.lock_acquire(code, "w1", 10)
    journal.run_set_status(code, RunStatus.RUNNING)
    assert Run.objects.get(code=code).status == Run.Status.PENDING  # not written yet

    guard = StateGuardCheckpointer(saver, journal=journal)
    graph = guard.compile(line_builder(["a"], []))
    graph.invoke({}, config(code), durability="sync")  # the instrumented graph, unguarded
    assert Run.objects.get(code=code).status == Run.Status.RUNNING


def test_it_refuses_every_write_of_a_worker_whose_lease_was_taken_over() -> None:
    slow, slow_saver = deferring()
    fast, fast_saver = deferring()
    code = str(Run.objects.create(agent="test", status=Run.Status.RUNNING).code)
    assert slow.lock_acquire(code, "worker-1", 0.05)
    slow.step_start(code, "t1", "a")
    slow.step_finish(code, "t1", StepStatus.SUCCEEDED, update={"n": 1})
    time.sleep(0.06)
    assert fast.lock_acquire(code, "worker-2", 10)  # expired: taken over, token bumped

    task_config: dict[str, Any] = {"configurable": {
        "thread_id": code, "checkpoint_ns": "", "checkpoint_id": "1f0a0000-0000-6000-8000-"
                                                                "000000000001"}}
    with pytest.raises(LeaseLost):
        slow_saver.put_writes(task_config, [("n", 1)], "t1")
    assert checkpoint_rows(code) == 0  # neither LangGraph's writes nor the step row
    assert not Step.objects.filter(run__code=code).exists()

    fast_saver.put_writes(task_config, [("n", 2)], "t2")
    assert checkpoint_rows(code) == 1


def test_it_journals_a_step_its_dead_worker_never_finished_as_in_doubt() -> None:
    """A worker dies in node b: its buffered row for b dies with it. The next worker finds b
    as a pending task of the last checkpoint and journals it in doubt before unwinding."""
    effects: list[str] = []

    def die_in_b(state: dict[str, Any]) -> dict[str, Any]:
        raise KeyboardInterrupt  # stands for SIGKILL: no handler of the guard runs after it

    dead_journal, dead_saver = deferring()
    code = str(Run.objects.create(agent="test").code)
    dead = StateGuardCheckpointer(dead_saver, journal=dead_journal, lease_ttl=0.3,
                                  lease_heartbeat=0.1)
    dead_graph = dead.compile(line_builder(["a", "b"], effects, {"b": die_in_b}))
    assert dead_journal.lock_acquire(code, "dead-worker", 0.3)
    dead_journal.run_set_status(code, RunStatus.RUNNING)
    with pytest.raises(KeyboardInterrupt):
        dead_graph.invoke({}, config(code), durability="sync")
    dead_journal._fences.clear()  # the process is gone: it holds nothing any more
    assert [s.node for s in Step.objects.filter(run__code=code)] == ["a"]
    time.sleep(0.35)  # its lease expires

    journal, saver = deferring()
    rescuer = StateGuardCheckpointer(saver, journal=journal, compensation_retry=FAST_RETRY,
                                     compensations={"a": undo(effects, "a"),
                                                    "b": undo(effects, "b")})
    report = rescuer.recover(rescuer.compile(line_builder(["a", "b"], effects)), config(code))

    # b's effect happened before the worker died; its compensation is not in_doubt_safe, so
    # it is left to an operator instead of guessing
    assert effects == ["a", "b", "undo:a"]
    steps = {s.node: s.status for s in Step.objects.filter(run__code=code)}
    assert steps == {"a": "succeeded", "b": "started"}
    assert Run.objects.get(code=code).status == Run.Status.NEEDS_ATTENTION
    assert [o.node for o in report.outcomes] == ["b", "a"]


def test_it_keeps_a_plain_postgres_saver_thread_free_of_journal_statements() -> None:
    """An unleased thread (no guard, or the bare benchmark) writes LangGraph's rows only."""
    _, saver = deferring()
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(dict)
    builder.add_node("a", lambda s: {"x": 1})
    builder.add_edge(START, "a")
    code = str(Run.objects.create(agent="test").code)
    builder.compile(checkpointer=saver).invoke({"x": 0}, config(code), durability="sync")
    assert checkpoint_rows(code) > 0
    assert not Step.objects.filter(run__code=code).exists()
