"""Step rows and the fence travel with LangGraph's checkpoint writes (PostgreSQL, ``step_rows``)."""

from __future__ import annotations

import gc
import importlib
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.models import F
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.func import entrypoint, task
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import RetryPolicy
from langgraph.warnings import LangGraphDeprecatedSinceV10

from stateguard import (
    ConfigurationError,
    Event,
    GuardedState,
    InvalidRunState,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from stateguard.runner import runner_config
from stateguard_web.runs import runtime
from stateguard_web.sagas.journal import DjangoJournal, LeaseLost
from stateguard_web.sagas.journal.checkpoints import JournalingPostgresSaver
from stateguard_web.sagas.models import Run, Step
from tests.core.agent_support import ScriptedModel, Shape, ask, go, say
from tests.core.support import FAST_RETRY, LineState, config, line_builder, undo
from tests.web.conftest import new_run

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
    code = new_run()
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
    code = new_run()
    assert journal.lock_acquire(code, "w1", 10)
    journal.run_set_status(code, RunStatus.RUNNING)
    assert Run.objects.get(code=code).status == Run.Status.PENDING  # not written yet

    guard = StateGuardCheckpointer(saver, journal=journal)
    graph = guard.compile(line_builder(["a"], []))
    # What the runner does under w1's lease: the graph invoked with the runner's config
    graph.invoke({}, runner_config(config(code)), durability="sync")
    assert Run.objects.get(code=code).status == Run.Status.RUNNING


def test_it_refuses_every_write_of_a_worker_whose_lease_was_taken_over() -> None:
    slow, slow_saver = deferring()
    fast, fast_saver = deferring()
    code = new_run()  # pending: its first run defers rows
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

    # a checkpoint too, fenced by the token it names (a trigger, migration 0006)
    checkpoint, at = empty_checkpoint(), {"configurable": {"thread_id": code, "checkpoint_ns": ""}}
    with pytest.raises(LeaseLost):
        slow_saver.put(at, checkpoint, {"source": "loop", "step": 1}, {})
    assert checkpoint_rows(code) == 0

    fast_saver.put_writes(task_config, [("n", 2)], "t2")
    fast_saver.put(at, checkpoint, {"source": "loop", "step": 1}, {})
    assert checkpoint_rows(code) == 2


def test_it_journals_a_step_its_dead_worker_never_finished_as_in_doubt() -> None:
    """A worker dies in node b: its buffered row for b dies with it. The next worker finds b
    as a pending task of the last checkpoint and journals it in doubt before unwinding."""
    effects: list[str] = []

    def die_in_b(state: dict[str, Any]) -> dict[str, Any]:
        raise KeyboardInterrupt  # stands for SIGKILL: no handler of the guard runs after it

    dead_journal, dead_saver = deferring()
    code = new_run()
    dead = StateGuardCheckpointer(dead_saver, journal=dead_journal, lease_ttl=0.3,
                                  lease_heartbeat=0.1)
    dead_graph = dead.compile(line_builder(["a", "b"], effects, {"b": die_in_b}))
    assert dead_journal.lock_acquire(code, "dead-worker", 0.3)
    dead_journal.run_set_status(code, RunStatus.RUNNING)
    with pytest.raises(KeyboardInterrupt):  # as its runner would, under "dead-worker"'s lease
        dead_graph.invoke({}, runner_config(config(code)), durability="sync")
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
    code = new_run()
    builder.compile(checkpointer=saver).invoke({"x": 0}, config(code), durability="sync")
    assert checkpoint_rows(code) > 0
    assert not Step.objects.filter(run__code=code).exists()


def test_it_fences_new_checkpoints_only_not_updates_of_old_ones() -> None:
    """An old checkpoint keeps the token it was written with: an update of it later (LangGraph's
    prune clears parent ids) is not a write of the worker that wrote it."""
    journal, saver = deferring()
    code = new_run()
    assert journal.lock_acquire(code, "w1", 10)
    saver.put({"configurable": {"thread_id": code, "checkpoint_ns": ""}}, empty_checkpoint(),
              {"source": "loop", "step": 1}, {})
    journal.lock_release(code, "w1")
    Run.objects.filter(code=code).update(fencing_token=99)  # leased and released since

    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = %s",
                       [code])
        assert cursor.rowcount == 1


def test_it_refuses_to_write_checkpoints_on_a_database_without_the_fence() -> None:
    create_trigger = importlib.import_module(
        "stateguard_web.sagas.migrations.0006_checkpoint_fence_trigger").TRIGGER
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER sagas_checkpoint_fence ON checkpoints")
    try:
        with pytest.raises(ImproperlyConfigured, match="migrate"):
            deferring()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(create_trigger)
    deferring()  # the fence is back


def dead_process(journal: DjangoJournal) -> None:
    """From now on the process is gone: it writes nothing more, not even its lease release."""
    def release(run_id: str, owner: str) -> None:
        journal._fences.pop(run_id, None)
        journal._buffer.forget(run_id)

    journal.lock_release = release  # type: ignore[method-assign]


def test_it_writes_a_resumed_run_at_once_so_a_crash_in_the_approved_step_is_swept() -> None:
    """Only a run's first run defers its rows: an approved step that dies leaves the run
    running (the sweeper's) with the step in doubt, not paused with nothing to approve."""
    effects: list[str] = []
    dying = {"b": False}

    def b_body(state: dict[str, Any]) -> dict[str, Any]:
        if dying["b"]:
            raise KeyboardInterrupt  # the worker dies after b's effect
        return {}

    journal, saver = deferring()
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal, approvals=["b"])
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": b_body}))
    assert "__interrupt__" in guard.invoke(graph, {}, config(code))
    dying["b"] = True
    dead_process(journal)
    with pytest.raises(KeyboardInterrupt):
        guard.approve(graph, config(code), by="alice")

    assert effects == ["a", "b"]
    assert Run.objects.get(code=code).status == Run.Status.RUNNING
    assert dict(Step.objects.filter(run__code=code).values_list("node", "status")) == {
        "a": "succeeded", "b": "started"}


def test_it_leaves_a_run_whose_retry_died_to_recovery() -> None:
    effects: list[str] = []
    fail = {"b": "raise"}

    def b_body(state: dict[str, Any]) -> dict[str, Any]:
        if fail["b"] == "raise":
            raise ValueError("b failed")
        if fail["b"] == "die":
            raise KeyboardInterrupt
        return {}

    journal, saver = deferring()
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal, on_error="hold")
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": b_body}))
    with pytest.raises(ValueError):
        guard.invoke(graph, {}, config(code))
    fail["b"] = "die"
    dead_process(journal)
    with pytest.raises(KeyboardInterrupt):
        guard.retry(graph, config(code))

    run = Run.objects.get(code=code)
    assert run.status == Run.Status.RUNNING  # the sweeper's, not "failed" for ever
    b = Step.objects.get(run=run, node="b")
    assert (b.status, b.attempt, b.prev_status) == ("started", 2, "failed")
    Run.objects.filter(code=code).update(lease_owner="", lease_expires_at=None)
    rescuer, rescuer_saver = deferring()
    again = StateGuardCheckpointer(rescuer_saver, journal=rescuer, on_error="hold")
    # A run whose worker died is recovery's (the sweeper's): a retry would re-run b, in doubt.
    with pytest.raises(InvalidRunState, match="only a failed run, or one held past its "
                                              "pivot, is retried"):
        again.retry(again.compile(line_builder(["a", "b", "c"], effects, {"b": b_body})),
                    config(code))


def test_it_commits_a_steps_rows_in_the_order_they_were_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two parallel tasks: the saver's write for one takes the other's start while that other
    runs on; it finishes, and a flush (a tool call's, on its thread's own connection) takes its
    finish. Had the finish committed first, the start (to ``sagas_journal`` a re-run) would set
    the step that succeeded back to "started": in doubt, its compensation skipped (seen in
    test_tool_storage.py's v2 agent under load, about 1 run in 20)."""
    journal, saver = deferring()
    code = new_run()
    assert journal.lock_acquire(code, "w1", 60)  # a first run: its rows wait for the writes
    journal.step_start(code, "x", "x")
    took, flush_went = threading.Event(), threading.Event()
    take, in_order = journal.take_pending, journal.rows_in_order

    def write() -> None:
        saver.put_writes({"configurable": {"thread_id": code, "checkpoint_ns": "",
                                           "checkpoint_id": "1"}}, [("log", ["y"])], "task-y")

    writer = threading.Thread(target=write)

    def take_then_pause(run_id: str, *, fence: bool = True) -> Any:
        pending = take(run_id, fence=fence)
        if threading.current_thread() is writer and pending and pending[1]:
            took.set()  # the saver's write carries x's start, not committed yet
            flush_went.wait()  # until the flush has written x's finish, or waits to
        return pending

    @contextmanager
    def flush_turn(run_id: str) -> Iterator[None]:
        if threading.current_thread() is not writer:
            lock = journal._in_order[run_id]
            if lock.acquire(blocking=False):
                lock.release()  # free: the flush goes first (and sets flush_went when done)
            else:
                flush_went.set()  # the flush waits for the write: it may go on
        with in_order(run_id):
            yield

    def finish_and_flush() -> None:
        took.wait()
        journal.step_finish(code, "x", StepStatus.SUCCEEDED, update={}, state_after={})
        try:
            journal.steps(code)  # flushes x's finish on this thread's connection
        finally:
            flush_went.set()
            connection.close()

    monkeypatch.setattr(journal, "take_pending", take_then_pause)
    monkeypatch.setattr(journal, "rows_in_order", flush_turn)
    other = threading.Thread(target=finish_and_flush)
    other.start()
    writer.start()
    writer.join()
    other.join()

    step = Step.objects.get(run__code=code, step_id="x")
    assert (step.status, step.attempt) == ("succeeded", 1)


def test_it_keeps_the_rows_of_a_checkpoint_write_that_failed_for_the_next_one() -> None:
    effects: list[str] = []
    journal, saver = deferring()
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal, compensation_retry=FAST_RETRY,
                                   compensations={n: undo(effects, n) for n in "abc"})
    graph = guard.compile(line_builder(["a", "b", "c"], effects))
    take = journal.take_pending
    dropped: list[str] = []

    def take_and_drop_the_connection(run_id: str, *, fence: bool = True) -> Any:
        pending = take(run_id, fence=fence)
        if pending and pending[1] and not dropped and any(
                row["node"] == "a" and row["finished_at"] for row in pending[1].steps):
            dropped.append("a")  # what a database restart does to this write
            return ("SELECT pg_terminate_backend(pg_backend_pid())", ()), pending[1]
        return pending

    journal.take_pending = take_and_drop_the_connection  # type: ignore[method-assign]
    with pytest.raises(psycopg.OperationalError):  # the connection dropped mid-write
        guard.invoke(graph, {}, config(code))
    journal.take_pending = take  # type: ignore[method-assign]

    assert dropped == ["a"]
    assert Step.objects.filter(run__code=code, node="a", status="succeeded").exists()
    guard.compensate(graph, config(code))
    assert "undo:a" in effects  # a's effect is undone: its row was not lost with the write


def test_it_journals_each_attempt_of_a_step_langgraph_retries_at_once() -> None:
    calls = {"b": 0}

    def b(state: dict[str, Any]) -> dict[str, Any]:
        calls["b"] += 1
        if calls["b"] == 1:
            raise ConnectionError("first try")
        return {"log": ["b"]}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    builder.add_node("a", lambda s: {"log": ["a"]})
    builder.add_node("b", b, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01,
                                                      jitter=False))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    journal, saver = deferring()
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal)
    guard.invoke(guard.compile(builder), {}, config(code))

    b_row = Step.objects.get(run__code=code, node="b")
    assert (b_row.status, b_row.attempt, b_row.prev_status, b_row.done_seq) == (
        "succeeded", 2, "failed", 2)


def test_it_refuses_a_deferring_journal_without_the_saver_that_writes_its_rows() -> None:
    journal = DjangoJournal(defer_steps=True)
    with pytest.raises(ConfigurationError, match="saver"):
        StateGuardCheckpointer(journal=journal)
    with pytest.raises(ConfigurationError, match="plain code"):
        GuardedState(run_id="r", journal=journal)


def test_it_records_a_first_runs_effects_beside_its_deferred_step_rows() -> None:
    from stateguard import Effect, record_effect
    from stateguard_web.sagas.models import Effect as EffectRow

    def charge(state: dict[str, Any]) -> dict[str, Any]:
        record_effect(Effect("stripe", "charge", "pi_first", amount=4200, currency="usd"))
        return {}

    journal, saver = deferring()
    code = new_run()
    guard = StateGuardCheckpointer(saver, journal=journal)
    guard.invoke(guard.compile(line_builder(["a", "charge"], [], {"charge": charge})), {},
                 config(code))
    row = EffectRow.objects.get(external_id="pi_first")
    step = Step.objects.get(run__code=code, node="charge")
    assert (str(row.run.code), row.step_id, row.node) == (code, step.step_id, "charge")


def test_it_finds_a_step_whose_row_waits_for_the_next_checkpoint_write() -> None:
    # A first run's rows wait in the journal for LangGraph's next write: a guarded tool call
    # LangGraph runs again must still find that it succeeded, as steps() would.
    journal, _ = deferring()
    code = new_run()
    assert journal.lock_acquire(code, "w1", 10)
    journal.step_start(code, "t1", "charge_card", ("payment",))
    journal.step_finish(code, "t1", StepStatus.SUCCEEDED, update={"charge_id": "ch_1"},
                        state_after={"messages": ["paid"]})
    journal.step_start(code, "t2", "book_flight")
    assert not Step.objects.filter(run__code=code).exists()  # pending, not written

    step = journal.step_get(code, "t1")
    assert step is not None
    assert (step.node, step.tags, step.status, step.update, step.state_after) == (
        "charge_card", ("payment",), StepStatus.SUCCEEDED, {"charge_id": "ch_1"},
        {"messages": ["paid"]})
    running = journal.step_get(code, "t2")
    assert running is not None and running.status == StepStatus.STARTED
    assert journal.step_get(code, "t3") is None
    assert {s.step_id: s for s in journal.steps(code)} == {"t1": step, "t2": running}


def test_it_writes_a_task_calls_start_before_its_body_runs() -> None:
    # An entrypoint is one node: no checkpoint write comes between its tasks, so a task's row
    # waiting for one would be lost with a process that dies in (or right after) its body.
    journal, saver = deferring()
    code = new_run()
    seen: list[tuple[str, str]] = []

    @task
    def charge_card(amount: int) -> dict[str, Any]:
        seen.extend(Step.objects.filter(run__code=code).order_by("started_at")
                    .values_list("node", "status"))
        return {"id": f"ch_{amount}"}

    def trip(inp: dict[str, int]) -> dict[str, Any]:
        return {"charge": charge_card(inp["amount"]).result()}

    guard = StateGuardCheckpointer(saver, journal=journal)
    out = guard.invoke(guard.compile(entrypoint()(trip)), {"amount": 5}, config(code))

    assert out == {"charge": {"id": "ch_5"}}
    # The run's move to running and the entrypoint's start went with the task's start.
    assert seen == [("trip", "started"), ("charge_card", "started")]
    run = Run.objects.get(code=code)
    assert run.status == Run.Status.SUCCEEDED
    assert list(Step.objects.filter(run=run).order_by("started_at").values_list(
        "node", "status", "update")) == [("trip", "succeeded", {"charge": {"id": "ch_5"}}),
                                         ("charge_card", "succeeded", {"id": "ch_5"})]
    assert Step.objects.get(run=run, node="charge_card").state_after == {"amount": 5}


def test_it_never_runs_a_task_body_for_a_worker_whose_lease_was_taken_over() -> None:
    journal, saver = deferring()
    code = new_run()
    ran: list[int] = []

    @task
    def charge_card(amount: int) -> int:
        ran.append(amount)
        return amount

    def trip(inp: dict[str, int]) -> int:
        Run.objects.filter(code=code).update(fencing_token=F("fencing_token") + 1)  # taken
        return int(charge_card(inp["amount"]).result())

    guard = StateGuardCheckpointer(saver, journal=journal)
    with pytest.raises(LeaseLost):
        guard.invoke(guard.compile(entrypoint()(trip)), {"amount": 5}, config(code))
    assert ran == []
    # The body and the task ran on LangGraph's threads, whose Django connections the error's
    # frames keep open: let them go, or the test database cannot be dropped.
    gc.collect()


@pytest.mark.parametrize("shape", ["v1", "v2"])
def test_it_writes_a_tool_calls_start_before_the_tool_runs(shape: Shape) -> None:
    # A tool call runs inside its tools task: no checkpoint write comes between its start and
    # its effect, and the checkpoint lists the tools task (no compensation), not the call.
    journal, saver = deferring()
    code = new_run()
    seen: list[tuple[str, str]] = []

    @tool
    def charge_card(amount: int) -> dict[str, Any]:
        """Charge the card."""
        seen.extend(Step.objects.filter(run__code=code).order_by("started_at")
                    .values_list("node", "status"))
        return {"id": f"ch_{amount}"}

    model = ScriptedModel(responses=[ask(("charge_card", {"amount": 5})), say("paid")])
    guard = StateGuardCheckpointer(saver, journal=journal)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        agent = guard.compile(create_react_agent(model, [charge_card], version=shape))
    guard.invoke(agent, go(), config(code))

    # The tools task's start went with the call's start.
    assert seen == [("agent", "succeeded"), ("tools", "started"), ("charge_card", "started")]
    run = Run.objects.get(code=code)
    assert run.status == Run.Status.SUCCEEDED
    charge = Step.objects.get(run=run, node="charge_card")
    assert (charge.status, charge.update["content"]) == ("succeeded", '{"id": "ch_5"}')


def test_it_never_runs_a_tool_for_a_worker_whose_lease_was_taken_over() -> None:
    code = new_run()
    ran: list[int] = []

    def take_over(event: Event) -> None:
        if (event.type, event.node) == ("step.started", "tools"):  # the call's start is next
            Run.objects.filter(code=code).update(fencing_token=F("fencing_token") + 1)

    @tool
    def charge_card(amount: int) -> int:
        """Charge the card."""
        ran.append(amount)
        return amount

    journal, saver = deferring()
    model = ScriptedModel(responses=[ask(("charge_card", {"amount": 5})), say("paid")])
    guard = StateGuardCheckpointer(saver, journal=journal, on_event=take_over)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        agent = guard.compile(create_react_agent(model, [charge_card]))
    with pytest.raises(LeaseLost):
        guard.invoke(agent, go(), config(code))
    assert ran == []
    gc.collect()  # LangGraph's threads' Django connections, kept open by the error's frames
