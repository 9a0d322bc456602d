"""Agents with tools: each tool call is a step of its own, compensated by the tool's name.

Every test runs the three shapes an agent comes in (create_react_agent v1, v2 with its Send
tasks, and a hand-built model node + ToolNode) in both forms (drop-in and guarded), on
InMemorySaver and SqliteSaver, with a scripted chat model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command, interrupt

from stateguard import (
    ConfigurationError,
    InMemoryJournal,
    RunStatus,
    SagaAborted,
    StateGuardCheckpointer,
    StepStatus,
)
from stateguard.records import StepRecord
from stateguard.tool_calls import TOOL_TAG
from stateguard.unwind import plan
from tests.core.agent_support import SHAPES, BookingFailed, Shape, Travel, agent, ask, go, say
from tests.core.support import FAST_RETRY, config
from tests.core.tool_forms import FORMS, Form, make_guard, run_agent, saver_for

SAVERS = ("memory", "sqlite")


def charge_then_fail() -> list:
    return [ask(("charge_card", {"amount": 4200})),
            ask(("book_flight", {"destination": "nowhere"})),
            say("booked")]


@pytest.mark.parametrize("saver_kind", SAVERS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_refunds_the_charge_once_when_the_booking_after_it_fails(
        shape: Shape, form: Form, saver_kind: str, tmp_path: Path) -> None:
    world = Travel()
    with saver_for(saver_kind, tmp_path) as saver:
        guard = make_guard(world, saver)
        _, error = run_agent(form, shape, world, charge_then_fail(), guard, "trip")

        assert isinstance(error, SagaAborted if form == "guarded" else BookingFailed)
        [(charge_id, _)] = world.charges
        # refunded once, by the compensation keyed "charge_card", which read the charge id
        # from the tool's result
        assert world.refunded == [charge_id]
        view = guard.status("trip")
        assert view.run.status == RunStatus.COMPENSATED
        [charge] = [s for s in view.steps if s.node == "charge_card"]
        assert charge.status == StepStatus.SUCCEEDED and TOOL_TAG in charge.tags
        assert charge.update["args"] == {"amount": 4200}
        assert charge.update["tool_call_id"] == "charge_card-1"
        assert '"charge_id"' in charge.update["content"]
        [booking] = [s for s in view.steps if s.node == "book_flight"]
        assert booking.status == StepStatus.FAILED
        assert "no flight to nowhere" in str(booking.error)
        # the key is per call: the compensation of that step, the same on every attempt
        [(_, key)] = world.refunds
        [comp] = [c for c in view.compensations if c.step_id == charge.step_id]
        assert comp.idempotency_key == key and comp.status == "succeeded"


@pytest.mark.parametrize("saver_kind", SAVERS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_undoes_the_calls_that_succeeded_beside_a_failing_one_newest_first(
        shape: Shape, form: Form, saver_kind: str, tmp_path: Path) -> None:
    world = Travel()
    with saver_for(saver_kind, tmp_path) as saver:
        guard = make_guard(world, saver)
        script = [ask(("charge_card", {"amount": 5000}), ("charge_card", {"amount": 10000}),
                      ("reserve_seat", {"seat": "12A"}),
                      ("book_flight", {"destination": "nowhere"})),
                  say("booked")]
        _, error = run_agent(form, shape, world, script, guard, "parallel")

        assert error is not None
        assert len(world.charges) == 2 and world.seats == []  # the seat was released (by tag)
        # the 50.00 charge answers after 50 ms, the 100.00 one after 100 ms: undone newest first
        assert world.refunded == [world.charges[1][0], world.charges[0][0]]
        report = error.report if isinstance(error, SagaAborted) else error.stateguard_report  # type: ignore[attr-defined]
        undone = [o.step_id for o in report.outcomes if o.status == "succeeded"]
        steps = {s.step_id: s for s in guard.status("parallel").steps}
        assert len(undone) == 3
        assert [steps[i].done_seq for i in undone] == sorted(
            (steps[i].done_seq for i in undone), reverse=True)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_refunds_a_charge_still_running_when_its_sibling_call_fails(
        shape: Shape, form: Form) -> None:
    # The booking fails after 150 ms, the 300.00 charge answers after 300 ms: the unwind must
    # not settle the run before the charge it will have made is journaled.
    world = Travel()
    guard = make_guard(world)
    script = [ask(("charge_card", {"amount": 30000}), ("book_flight", {"destination": "nowhere"})),
              say("booked")]
    _, error = run_agent(form, shape, world, script, guard, "late")

    assert error is not None
    assert world.refunded == [world.charges[0][0]]
    assert guard.status("late").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("saver_kind", SAVERS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_unwinds_a_tool_error_the_model_was_told_of_by_default(
        shape: Shape, form: Form, saver_kind: str, tmp_path: Path) -> None:
    world = Travel()
    with saver_for(saver_kind, tmp_path) as saver:
        guard = make_guard(world, saver)
        _, error = run_agent(form, shape, world, charge_then_fail(), guard, "told",
                             handle_tool_errors=True)

        assert error is not None and "ToolCallFailed" in repr(error)
        assert world.refunded == [world.charges[0][0]]
        assert guard.status("told").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("saver_kind", SAVERS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_lets_the_model_handle_a_tool_error_when_told_to(
        shape: Shape, form: Form, saver_kind: str, tmp_path: Path) -> None:
    world = Travel()
    with saver_for(saver_kind, tmp_path) as saver:
        guard = make_guard(world, saver, on_tool_error="model")
        out, error = run_agent(form, shape, world, charge_then_fail(), guard, "model",
                               handle_tool_errors=True)

        assert error is None and out["messages"][-1].content == "booked"
        assert world.refunds == [] and len(world.charges) == 1
        view = guard.status("model")
        assert view.run.status == RunStatus.SUCCEEDED
        [booking] = [s for s in view.steps if s.node == "book_flight"]
        assert booking.status == StepStatus.FAILED and booking.error is not None
        assert booking.error.type == "ToolError"


def test_it_takes_the_policy_per_tool() -> None:
    world = Travel()
    guard = make_guard(world, on_tool_error={"book_flight": "model"})
    _, error = run_agent("guarded", "v2", world, charge_then_fail(), guard, "per-tool",
                           handle_tool_errors=True)
    assert error is None and world.refunds == []


def test_it_lets_a_read_only_tool_fail_with_nothing_to_undo_under_auto() -> None:
    # A tool with no compensation failing before any effect: the model may try again.
    world = Travel()
    guard = make_guard(world)
    script = [ask(("book_flight", {"destination": "nowhere"})),
              ask(("book_flight", {"destination": "Lisbon"})), say("booked")]
    _, error = run_agent("dropin", "v2", world, script, guard, "retry-by-model",
                           handle_tool_errors=True)
    assert error is None and world.bookings == ["Lisbon"]


@pytest.mark.parametrize("form", FORMS)
def test_it_validates_compensations_against_the_tools_the_graph_can_call(form: Form) -> None:
    world = Travel()
    guard = StateGuardCheckpointer(compensations={"charge_crad": world.refund})
    with pytest.raises(ConfigurationError, match=r"charge_crad.*tools are \['book_flight', "
                                                 r"'charge_card', 'reserve_seat'\]"):
        if form == "guarded":
            guard.compile(agent("v2", world, [say("hi")]))
        else:
            agent("v2", world, [say("hi")], checkpointer=guard).invoke(go(), config("typo"))
    with pytest.raises(ConfigurationError, match="on_tool_error"):
        StateGuardCheckpointer(on_tool_error="ignore")  # type: ignore[arg-type]


def test_it_leaves_a_tool_node_alone_in_a_graph_without_a_guard() -> None:
    # The wrapper is put on the ToolNode object; the same agent run unguarded is untouched.
    world = Travel()
    guarded = make_guard(world)
    graph = agent("v1", world, [ask(("charge_card", {"amount": 100})), say("ok")])
    guarded.compile(graph)
    out = graph.invoke(go(), config("plain"))
    assert out["messages"][-1].content == "ok" and len(world.charges) == 1


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_refunds_once_on_a_postgres_saver(shape: Shape, form: Form,
                                             pg_dsn: str) -> None:
    world = Travel()
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        guard = make_guard(world, saver)
        _, error = run_agent(form, shape, world, charge_then_fail(), guard, f"pg-{shape}-{form}")
    assert error is not None
    assert world.refunded == [world.charges[0][0]]
    assert guard.status(f"pg-{shape}-{form}").run.status == RunStatus.COMPENSATED


@pytest.mark.parametrize("form", FORMS)
def test_it_lets_the_model_retry_a_read_only_tool_in_a_later_turn(form: Form) -> None:
    # Turn 1 charged and is settled; in turn 2 a tool with nothing to undo fails, and this turn
    # has no effect yet: under "auto" the model tries again, and turn 1's charge stays.
    world = Travel()
    guard = make_guard(world)
    script = [ask(("charge_card", {"amount": 1000})), say("paid"),
              ask(("book_flight", {"destination": "nowhere"})),
              ask(("book_flight", {"destination": "Lisbon"})), say("booked")]
    graph = agent("v2", world, script, handle_tool_errors=True,
                  checkpointer=guard if form == "dropin" else None)
    if form == "guarded":
        graph = guard.compile(graph)
    for text in ("pay", "and a flight"):
        if form == "dropin":
            graph.invoke(go(text), config("turns"), durability="sync")
        else:
            guard.invoke(graph, go(text), config("turns"))

    assert world.bookings == ["Lisbon"] and world.refunds == []
    assert guard.status("turns").run.status == RunStatus.SUCCEEDED


class Confirming(Travel):
    """The travel world with a tool that asks the customer itself, by ``interrupt()``."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[Any] = []
        self.unconfirmed: list[str] = []

    def tools(self) -> list[BaseTool]:
        world = self

        @tool
        def confirm_trip(question: str) -> str:
            """Ask the customer to confirm the trip."""
            answer = interrupt({"question": question})
            world.answers.append(answer)
            return f"the customer said {answer}"

        return [*super().tools(), confirm_trip]

    def unconfirm(self, state: dict[str, Any], ctx: Any) -> bool:
        self.unconfirmed.append(ctx.step_id)
        return True


@pytest.mark.parametrize("saver_kind", SAVERS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_journals_a_tool_that_calls_interrupt_as_paused_then_as_it_ends_on_resume(
        shape: Shape, form: Form, saver_kind: str, tmp_path: Path) -> None:
    world = Confirming()
    with saver_for(saver_kind, tmp_path) as saver:
        guard = StateGuardCheckpointer(saver, compensations={
            "charge_card": world.refund, "confirm_trip": world.unconfirm},
            compensation_retry=FAST_RETRY)
        graphs: dict[str, Any] = {}

        def invoke(value: Any, thread: str) -> Any:
            if thread not in graphs:  # a graph per thread: each model follows its own script
                script = [ask(("charge_card", {"amount": 4200})),
                          ask(("confirm_trip", {"question": "Lisbon for 42.00?"})), say("booked")]
                built = agent(shape, world, script,
                              checkpointer=guard if form == "dropin" else None)
                graphs[thread] = built if form == "dropin" else guard.compile(built)
            if form == "dropin":
                return graphs[thread].invoke(value, config(thread), durability="sync")
            return guard.invoke(graphs[thread], value, config(thread))

        def steps(thread: str, node: str | None = None) -> list[Any]:
            return [s for s in guard.status(thread).steps if node in (None, s.node)]

        for thread in ("yes", "undo"):
            invoke(go(), thread)
            assert guard.status(thread).run.status == RunStatus.PAUSED
            [paused] = steps(thread, "confirm_trip")
            # waiting, not failed: no error to show, nothing to undo (nor its tools node)
            assert (paused.status, paused.error, paused.attempt) == (StepStatus.PAUSED, None, 1)
            assert TOOL_TAG in paused.tags
            assert StepStatus.FAILED not in {s.status for s in steps(thread)}

        # Resumed, the call runs again from its start: the same step, started anew, succeeds.
        out = invoke(Command(resume="yes"), "yes")
        assert out["messages"][-1].content == "booked" and world.answers == ["yes"]
        [resumed] = steps("yes", "confirm_trip")
        assert (resumed.status, resumed.error, resumed.attempt) == (
            StepStatus.SUCCEEDED, None, 2)
        assert {s.status for s in steps("yes")} == {StepStatus.SUCCEEDED}
        assert guard.status("yes").run.status == RunStatus.SUCCEEDED

        # Unwound while paused: the charge is refunded, the paused call is not undone.
        planned = plan(guard.core.journal, "undo", guard.core.spec, include_in_doubt=True)
        assert [p.step.node for p in planned if p.compensation is not None] == ["charge_card"]
        if form == "guarded":  # the operator's "compensate" (the drop-in form has none)
            report = guard.compensate(graphs["undo"], config("undo"))
            assert report.compensated == ["charge_card"]
            assert "confirm_trip" not in {o.node for o in report.outcomes}
            assert world.refunded == [world.charges[1][0]] and world.unconfirmed == []
            assert guard.status("undo").run.status == RunStatus.COMPENSATED
            assert [s.status for s in steps("undo", "confirm_trip")] == [StepStatus.PAUSED]


class ReadCounting(InMemoryJournal):
    """Counts the reads of a whole run's steps."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def steps(self, run_id: str) -> list[StepRecord]:
        self.reads += 1
        return super().steps(run_id)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES)
def test_it_looks_up_a_tool_calls_own_step_without_reading_the_runs_steps(
        shape: Shape, form: Form) -> None:
    # Before each call the wrapper asks whether LangGraph is running it again after it
    # succeeded. Reading every step of the run for that (each with the state after it, the
    # whole conversation) made a run of n calls read O(n^2): the reads must not grow with n.
    reads = {}
    for calls in (1, 6):
        world, journal = Travel(), ReadCounting()
        script = [*(ask(("reserve_seat", {"seat": f"{n}A"})) for n in range(calls)),
                  say("held")]
        _, error = run_agent(form, shape, world, script, make_guard(world, journal=journal),
                             f"seats-{calls}")
        assert error is None and len(world.seats) == calls
        reads[calls] = journal.reads
    assert reads[6] == reads[1]
