"""Terminate: an operator stops a run now (``guard.terminate``, ``stateguard.stops``). A sync run
stops at its next step boundary, an async one at once (its step cancelled, in doubt); then it
is unwound or held, as asked. Across processes the journal carries the request, and recovery
honours it when the run's process died first."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from stateguard import (
    Compensation,
    ConfigurationError,
    InMemoryJournal,
    InvalidRunState,
    RunStatus,
    RunTerminated,
    SagaAborted,
    StateGuardCheckpointer,
    StepKind,
    StepStatus,
    StopRequest,
)
from stateguard.journal import StopJournal
from stateguard.lifecycle import Action, Pivot, allowed, refusal
from tests.core.support import FAST_RETRY, config, line_builder


class Slow:
    """A node body that waits until the test lets it go, after saying it started."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()

    def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        self.started.set()
        assert self.go.wait(10)
        return {}


def _reasons(log: list[str]) -> Any:
    def undo(name: str) -> Any:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            log.append(f"undo:{name}:{ctx.reason}")
            return True
        return compensation
    return undo


def _running(guard: StateGuardCheckpointer, graph: Any, thread: str
             ) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            guard.invoke(graph, {}, config(thread))
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    return worker, raised


@pytest.mark.parametrize("then", ["unwind", "hold"])
def test_it_stops_a_sync_run_at_its_next_step_and_unwinds_or_holds_it(then: str) -> None:
    effects: list[str] = []
    undo = _reasons(effects)
    slow = Slow()
    guard = StateGuardCheckpointer(compensations={"a": undo("a"), "b": undo("b")},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": slow}))
    worker, raised = _running(guard, graph, "t")
    assert slow.started.wait(10)

    # b's body runs: it finishes (its effect is made whole), and c never starts.
    assert guard.terminate(graph, config("t"), then=then,  # type: ignore[arg-type]
                           by="carol", reason="wrong customer") is None
    slow.go.set()
    worker.join(10)

    (aborted,) = raised
    assert isinstance(aborted, SagaAborted) and isinstance(aborted.cause, RunTerminated)
    assert aborted.cause.node == "c"
    view = guard.status("t")
    assert view.run.error is not None and view.run.error.type == "RunTerminated"
    assert "terminated by carol: wrong customer" in view.run.error.message
    if then == "unwind":
        assert effects == ["a", "b", "undo:b:terminated", "undo:a:terminated"]
        assert view.run.status == RunStatus.COMPENSATED
        assert {c.triggered_by for c in view.compensations} == {"carol"}
    else:
        assert effects == ["a", "b"]  # held as it is: nothing undone
        assert view.run.status == RunStatus.NEEDS_ATTENTION
        assert aborted.report.held == "terminated by carol: wrong customer"
    assert [s.node for s in view.steps] == ["a", "b"]
    # Carried out: a later terminate is refused by the state machine.
    with pytest.raises(InvalidRunState, match="only a pending or running run is terminated"):
        guard.terminate(graph, config("t"))


def test_it_cancels_an_async_step_at_once_and_leaves_it_in_doubt() -> None:
    effects: list[str] = []
    checked: list[str] = []
    started = threading.Event()

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(30)
        effects.append("b")
        return {}

    def undo_b(state: dict[str, Any], ctx: Any) -> bool:
        checked.append(f"looked for b's effect (in doubt: {ctx.in_doubt})")
        return False  # found none

    guard = StateGuardCheckpointer(
        compensations={"a": _reasons(effects)("a"),
                       "b": Compensation(undo_b, in_doubt_safe=True)},
        compensation_retry=FAST_RETRY)
    graph = guard.compile(_with_async_b(effects, slow))

    async def main() -> BaseException:
        run = asyncio.create_task(guard.ainvoke(graph, {}, config("t")))
        await asyncio.to_thread(started.wait, 10)
        # From another thread, as the lease's heartbeat (or an operator's) would ask.
        await asyncio.to_thread(guard.terminate, graph, config("t"), by="carol")
        with pytest.raises(SagaAborted) as aborted:
            await asyncio.wait_for(run, 10)
        return aborted.value

    aborted = asyncio.run(main())

    assert isinstance(aborted.cause, RunTerminated)
    assert effects == ["a", "undo:a:terminated"]  # b never finished
    assert checked == ["looked for b's effect (in doubt: True)"]
    view = guard.status("t")
    assert [(s.node, s.status) for s in view.steps] == [("a", StepStatus.SUCCEEDED),
                                                        ("b", StepStatus.STARTED)]
    assert view.run.status == RunStatus.COMPENSATED


def _with_async_b(effects: list[str], slow: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    from tests.core.support import LineState

    builder: Any = StateGraph(LineState)
    for name in ("a", "c"):
        builder.add_node(name, lambda s, name=name: effects.append(name) or {"log": [name]})
    builder.add_node("b", slow)  # async: the guard's ainvoke cancels it
    for first, then in zip([START, "a", "b", "c"], ["a", "b", "c", END], strict=True):
        builder.add_edge(first, then)
    return builder


class RequestsJournal(InMemoryJournal):
    """A journal that keeps operators' stop requests, as the web app's does (``StopJournal``):
    another process leaves them here."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, StopRequest] = {}
        self.done: list[tuple[str, str, RunStatus]] = []

    def run_stop_requested(self, run_id: str) -> StopRequest | None:
        return self.requests.get(run_id)

    def run_stop_done(self, run_id: str, stop: StopRequest, status: RunStatus) -> None:
        if self.requests.get(run_id) == stop:
            del self.requests[run_id]
        self.done.append((run_id, stop.id, status))


def heard(guard: StateGuardCheckpointer, run_id: str) -> None:
    """Until the guard's lease heartbeat brought the journal's request to the run's process."""
    deadline = time.monotonic() + 5
    while guard.core.stops.get(run_id) is None:
        assert time.monotonic() < deadline, "the heartbeat never saw the request"
        time.sleep(0.01)


def test_the_lease_heartbeat_brings_a_request_left_in_the_journal() -> None:
    journal = RequestsJournal()
    assert isinstance(journal, StopJournal)
    effects: list[str] = []
    slow = Slow()
    guard = StateGuardCheckpointer(journal=journal, lease_ttl=1.0, lease_heartbeat=0.05,
                                   compensations={"a": _reasons(effects)("a")})
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": slow}))
    worker, raised = _running(guard, graph, "t")
    assert slow.started.wait(10)
    journal.requests["t"] = StopRequest("unwind", "dave", id="req-1")  # another process
    # The lease's heartbeat sees it within a beat or two, while b's body still runs.
    heard(guard, "t")
    slow.go.set()
    worker.join(10)

    assert isinstance(raised[0], SagaAborted)
    assert effects == ["a", "b", "undo:a:terminated"]  # b has no compensation
    assert journal.done == [("t", "req-1", RunStatus.COMPENSATED)] and not journal.requests


@pytest.mark.parametrize("then", ["unwind", "hold"])
def test_recovery_honours_a_stop_asked_before_the_process_died(then: str) -> None:
    class Died(BaseException):
        pass

    effects: list[str] = []
    journal = RequestsJournal()

    def dies(state: dict[str, Any]) -> dict[str, Any]:
        raise Died  # the process dies in b (after its effect): b in doubt, the run running

    guard = StateGuardCheckpointer(journal=journal, compensations={"a": _reasons(effects)("a")},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": dies}))
    with pytest.raises(Died):
        guard.invoke(graph, {}, config("t"))
    assert guard.status("t").run.status == RunStatus.RUNNING
    journal.requests["t"] = StopRequest(then, "erin", "stuck")  # type: ignore[arg-type]

    # The agent's policy says resume: the stop wins (the operator asked it to stop).
    guard.recover(graph, config("t"), resume=True)

    view = guard.status("t")
    assert "c" not in effects and effects.count("b") == 1
    if then == "unwind":
        assert effects == ["a", "b", "undo:a:terminated"]
        # b, in doubt, has no compensation: nothing of it to undo.
        assert view.run.status == RunStatus.COMPENSATED
        assert [(c.node, c.triggered_by) for c in view.compensations] == [("a", "erin")]
    else:
        assert view.run.status == RunStatus.NEEDS_ATTENTION
        assert effects == ["a", "b"]
    assert not journal.requests and journal.done[0][2] == view.run.status


def test_recovery_goes_on_with_a_stops_unwind_its_process_died_in() -> None:
    class Died(BaseException):
        pass

    effects: list[str] = []
    journal = RequestsJournal()
    crash = [True]

    def undo_b(state: dict[str, Any], ctx: Any) -> bool:
        if crash[0]:
            crash[0] = False
            raise Died  # the process dies while the stop's unwind runs
        effects.append(f"undo:b:{ctx.reason}")
        return True

    slow = Slow()
    guard = StateGuardCheckpointer(journal=journal, lease_ttl=1.0, lease_heartbeat=0.05,
                                   compensations={"a": _reasons(effects)("a"), "b": undo_b},
                                   compensation_retry=FAST_RETRY)
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": slow}))
    worker, raised = _running(guard, graph, "t")
    assert slow.started.wait(10)
    journal.requests["t"] = StopRequest("unwind", "dave", id="req-2")
    heard(guard, "t")
    slow.go.set()
    worker.join(10)
    assert isinstance(raised[0], Died)
    assert guard.status("t").run.status == RunStatus.COMPENSATING
    assert journal.requests  # not carried out: still asked

    guard.recover(graph, config("t"))

    assert effects == ["a", "b", "undo:b:terminated", "undo:a:terminated"]
    assert guard.status("t").run.status == RunStatus.COMPENSATED
    assert journal.done == [("t", "req-2", RunStatus.COMPENSATED)] and not journal.requests


def test_a_pending_run_is_cancelled_with_nothing_to_undo() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer()
    graph = guard.compile(line_builder(["a"], effects))
    for thread, then, status in [("p1", "unwind", RunStatus.COMPENSATED),
                                 ("p2", "hold", RunStatus.NEEDS_ATTENTION)]:
        guard.journal.run_begin(thread)
        guard.journal.run_set_status(thread, RunStatus.PENDING)  # queued, not started
        report = guard.terminate(graph, config(thread), then=then,  # type: ignore[arg-type]
                                 by="carol")
        assert report is not None and report.outcomes == ()
        assert guard.status(thread).run.status == status
    assert effects == []


def test_it_refuses_what_terminate_cannot_do() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer()
    graph = guard.compile(line_builder(["a"], effects))
    guard.invoke(graph, {}, config("done"))
    with pytest.raises(InvalidRunState, match="run done is succeeded; only a pending or "
                                              "running run is terminated"):
        guard.terminate(graph, config("done"))
    with pytest.raises(ConfigurationError, match="then must be one of unwind, hold"):
        guard.terminate(graph, config("done"), then="stop")  # type: ignore[arg-type]

    # Past its pivot a run is not unwound (half a saga): held, it may be.
    assert refusal(Action.TERMINATE, "running", run="r", pivot=Pivot("ship")) == (
        "run r passed its pivot 'ship' (the point of no return), so unwinding it would undo "
        "half a saga; terminate it and hold it instead")
    assert refusal(Action.TERMINATE, "running", pivot=None) is None
    assert Action.TERMINATE in allowed(RunStatus.RUNNING)
    assert Action.TERMINATE in allowed(RunStatus.PENDING)
    assert Action.TERMINATE not in allowed(RunStatus.PAUSED)
    assert "(terminate by carol)" in str(refusal(Action.TERMINATE, "running",
                                                 waiting="terminate by carol"))


def test_a_run_past_its_pivot_asked_to_unwind_is_held() -> None:
    # The pivot passed between the request and the step boundary: the unwind holds it.
    effects: list[str] = []
    slow = Slow()
    guard = StateGuardCheckpointer(kinds={"b": StepKind.PIVOT},
                                   compensations={"a": _reasons(effects)("a")})
    graph = guard.compile(line_builder(["a", "b", "c"], effects, {"b": slow}))
    worker, raised = _running(guard, graph, "t")
    assert slow.started.wait(10)
    guard.terminate(graph, config("t"), by="carol")
    slow.go.set()
    worker.join(10)

    assert effects == ["a", "b"]
    view = guard.status("t")
    assert view.run.status == RunStatus.NEEDS_ATTENTION
    assert "passed its pivot 'b'" in str(raised[0])
