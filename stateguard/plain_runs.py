"""Plain runs: a guarded graph run by LangGraph's own ``invoke``/``stream``/``ainvoke``/``astream``.

That is the drop-in form (``builder.compile(checkpointer=guard)``), and a graph compiled by
``guard.compile`` but invoked without the guard's runner. LangGraph never tells a checkpointer
which graph it serves, nor when a run ends; but it calls ``get_tuple`` from its loop's
``__enter__`` as a run starts. There the guard finds the graph and the loop, and:

1. wraps the graph's nodes, the first time it sees the graph (``stateguard.instrument``): from
   then on every step is journaled, every invariant enforced and every approval gated by the
   same wrappers as in the guarded form, in every durability mode;
2. takes the run's lease (``RunLocked`` if another process runs the thread) and begins the
   turn: a finished turn's thread starts a new one; a turn that is compensating or needs
   attention is refused; new input on an unfinished turn that owes an undo is refused; a
   ``Command`` is refused while an approval gate waits (``InvalidRunState``, before any node);
3. settles the turn when the loop exits, after LangGraph's executor has waited for every task
   of it (an exit callback on the loop's exit stack), exactly as the runner does: an error is
   unwound (or held, per ``on_error``) before it reaches the caller, which gets the report as
   ``exc.stateguard_report`` and in a note; a run past its ``recursion_limit`` is unwound and
   raises ``GraphRecursionError`` with the report; a finished graph's final state is checked
   (``InvariantViolation`` after unwinding) and the turn succeeds; an interrupted one pauses.
   A run cancelled, interrupted (``KeyboardInterrupt``) or whose stream's consumer stopped is
   left ``running``, as a dead process leaves it: ``guard.recover`` unwinds it, and the
   thread's next ``invoke(None)`` resumes it.

LangGraph internals relied on (pinned to langgraph 1.2; ``tests/core/test_langgraph_internals``
fails by name if they move): ``Pregel.stream``/``astream`` enter a ``PregelLoop`` whose
``__enter__`` calls ``get_tuple`` (the graph and the loop are the ``self`` of frames above it),
and the loop's ``stack`` (its exit stack), ``status``, ``durability``, ``input`` and ``config``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import weakref
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.errors import ErrorCode, GraphRecursionError, create_error_message
from langgraph.pregel import Pregel
from langgraph.types import Command

from stateguard.exceptions import ConfigurationError, InvalidRunState
from stateguard.instrument import RUNNER_KEY
from stateguard.journal import TurnJournal, turn_steps
from stateguard.lifecycle import NEXT_TURN
from stateguard.records import EFFECT_STATUSES, RunStatus, StepStatus
from stateguard.report import UnwindReport

if TYPE_CHECKING:
    from stateguard.operator_actions import GuardOperations

logger = logging.getLogger("stateguard")

_LOOP_MODULE, _LOOP_CLASS = "langgraph.pregel._loop", "PregelLoop"
# How far above get_tuple Pregel.stream's frame may be (it is 2-3 frames up in langgraph 1.2).
_FRAMES = 40
_ABORTING = (RunStatus.COMPENSATING, RunStatus.NEEDS_ATTENTION)


def attach_report(exc: BaseException, report: UnwindReport) -> None:
    with contextlib.suppress(AttributeError):  # exceptions with __slots__ only get the note
        exc.stateguard_report = report  # type: ignore[attr-defined]
    exc.add_note(f"StateGuard: {report}")


def thread_config(run_id: str) -> RunnableConfig:
    """The thread's latest checkpoint (after time travel, the head of the new branch)."""
    return {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}}


class PlainRuns:
    def __init__(self, guard: GuardOperations) -> None:
        self.guard = guard
        # The loops whose runs were begun: a loop may call get_tuple more than once as it
        # starts (time travel reads the addressed checkpoint, then its successors).
        self._begun: weakref.WeakSet[Any] = weakref.WeakSet()

    def on_get_tuple(self, config: RunnableConfig, saved: CheckpointTuple | None) -> None:
        """Called with every ``get_tuple`` (``saved``: what it returned): begin the turn when it
        is a plain run's start."""
        conf = config.get("configurable", {})
        if conf.get(RUNNER_KEY) or conf.get("checkpoint_ns"):
            return  # the runner settles its own turns; a subgraph's state is its parent's step
        graph, loop = _starting_run(sys._getframe(2))
        if graph is None:
            return  # get_state() and other reads, not a run
        if loop is None or not isinstance(getattr(loop, "stack", None), contextlib.ExitStack
                                          | contextlib.AsyncExitStack):
            raise ConfigurationError(
                "StateGuard cannot follow this LangGraph version's runs (its loop moved): install "
                "the langgraph version stateguard pins, or run graphs with guard.invoke()")
        if loop not in self._begun:
            self._begin(graph, loop, str(conf["thread_id"]), saved)
            self._begun.add(loop)

    def _begin(self, graph: Pregel[Any, Any, Any, Any], loop: Any, run_id: str,
               saved: CheckpointTuple | None) -> None:
        guard = self.guard
        guard._check_graph(graph)  # wraps its nodes, the first time
        if getattr(guard.core.journal, "defers_steps", False) and loop.durability != "sync":
            raise ConfigurationError(
                "this journal writes its step rows with the saver's checkpoint writes "
                f"(defers_steps), which durability={loop.durability!r} delays or skips: invoke "
                "with durability='sync', or run the graph with guard.invoke()")
        held = contextlib.ExitStack()
        held.enter_context(guard.core.lease(run_id))
        try:
            self._start_turn(run_id, loop.input, saved)
        except BaseException:
            held.close()
            raise
        # LangGraph calls no exit when its __enter__ fails after get_tuple (bad input, say):
        # then the lease goes when the loop is collected. Else on exit, after the turn ended.
        released = weakref.finalize(loop, held.close)
        released.atexit = False
        loop.stack.callback(released)
        end = _TurnEnd(guard, graph, run_id, weakref.ref(loop))
        if isinstance(loop.stack, contextlib.AsyncExitStack):
            loop.stack.push_async_exit(end.aexit)  # async compensations on the caller's loop
        else:
            loop.stack.push(end.exit)

    def _start_turn(self, run_id: str, input: Any, saved: CheckpointTuple | None) -> None:
        core = self.guard.core
        journal = core.journal
        run = self.guard._run_record(run_id)  # the lease created it if it was new
        if run.status in _ABORTING:
            raise InvalidRunState(
                f"run {run_id!r} is {run.status}: an effect is still being undone, or could "
                "not be undone and waits for an operator (guard.compensate, retry_compensation "
                "or resolve); continue once it is settled")
        if isinstance(input, Command):  # the tasks the loaded checkpoint waits on
            self.guard.refuse_gated_resume(run_id, {
                task for task, channel, _ in (saved.pending_writes or []) if channel == INTERRUPT
            } if saved is not None else set())
        if run.status in NEXT_TURN:
            self._next_turn(run_id)
        elif input is not None and not isinstance(input, Command) and turn_steps(
                journal, run_id, run):
            self._leave_turn(run_id, run.status)
        core.set_status(run_id, RunStatus.RUNNING)

    def _next_turn(self, run_id: str) -> None:
        journal = self.guard.core.journal
        if not isinstance(journal, TurnJournal):
            raise InvalidRunState(
                f"run {run_id!r} finished and this journal keeps one saga per thread: start a "
                "new thread_id")
        journal.run_next_turn(run_id)

    def _leave_turn(self, run_id: str, status: RunStatus) -> None:
        """New input on a turn that has not ended (paused, held failed, or cut short): LangGraph
        starts again from START, so it is a new turn, allowed only when the old one owes no
        undo (no step with an effect to compensate, none in doubt)."""
        spec = self.guard.core.spec
        owed = sorted({s.node for s in turn_steps(self.guard.core.journal, run_id)
                       if s.status in (*EFFECT_STATUSES, StepStatus.STARTED)
                       and spec.compensation_for(s.node, s.tags) is not None})
        if owed:
            raise InvalidRunState(
                f"run {run_id!r} is {status} and its turn's effects {owed} are not settled: "
                "finish it (approve, Command(resume=...), invoke(None)), or undo it "
                "(guard.reject, guard.compensate, guard.recover) before new input")
        self._next_turn(run_id)


class _TurnEnd:
    """Settles a plain run's turn when LangGraph's loop exits (see the module's docstring)."""

    def __init__(self, guard: GuardOperations, graph: Pregel[Any, Any, Any, Any], run_id: str,
                 loop: weakref.ref[Any]) -> None:
        # The loop only weakly: its exit stack holds this, and the loop must die with its run.
        self.guard, self.graph, self.run_id, self.loop = guard, graph, run_id, loop
        self.config = thread_config(run_id)

    def exit(self, exc_type: type[BaseException] | None, exc: BaseException | None,
             tb: TracebackType | None) -> bool:
        guard, graph, config = self.guard, self.graph, self.config
        if exc is not None:
            if isinstance(exc, Exception):
                report = guard.unwind_failed(graph, config, exc)
                if report is not None:
                    attach_report(exc, report)
            else:
                _cut_short(self.run_id, exc)
            return False
        status, limit = self._loop_status()
        if status == "out_of_steps":
            error = _recursion_error(limit)
            report = guard.unwind_failed(graph, config, error)
            if report is not None:  # held: LangGraph raises its own
                attach_report(error, report)
                raise error
        elif status == "done":
            values = graph.get_state(config).values
            violation = guard.settle(config, (), values)
            if violation is not None:
                attach_report(violation, guard.unwind_violation(graph, config, violation, values))
                raise violation
        elif status != "draining":  # drained: stopped between steps, resumed by invoke(None)
            guard.core.set_status(self.run_id, RunStatus.PAUSED)
        return False

    async def aexit(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                    tb: TracebackType | None) -> bool:
        guard, graph, config = self.guard, self.graph, self.config
        if exc is not None:
            if isinstance(exc, Exception):
                report = await guard.aunwind_failed(graph, config, exc)
                if report is not None:
                    attach_report(exc, report)
            else:
                _cut_short(self.run_id, exc)
            return False
        status, limit = self._loop_status()
        if status == "out_of_steps":
            error = _recursion_error(limit)
            report = await guard.aunwind_failed(graph, config, error)
            if report is not None:
                attach_report(error, report)
                raise error
        elif status == "done":
            values = (await graph.aget_state(config)).values
            violation = guard.settle(config, (), values)
            if violation is not None:
                attach_report(violation, await guard.aunwind_violation(graph, config, violation,
                                                                       values))
                raise violation
        elif status != "draining":
            guard.core.set_status(self.run_id, RunStatus.PAUSED)
        return False

    def _loop_status(self) -> tuple[str | None, Any]:
        loop = self.loop()
        if loop is None:
            return None, None
        return getattr(loop, "status", None), (getattr(loop, "config", None) or {}).get(
            "recursion_limit")


def _recursion_error(limit: Any) -> GraphRecursionError:
    """The error LangGraph raises right after its loop exits past the recursion limit, raised
    here instead so that it carries the report of the unwind."""
    return GraphRecursionError(create_error_message(
        message=f"Recursion limit of {limit} reached without hitting a stop condition. You can "
                "increase the limit by setting the `recursion_limit` config key.",
        error_code=ErrorCode.GRAPH_RECURSION_LIMIT))


def _cut_short(run_id: str, exc: BaseException) -> None:
    logger.warning("StateGuard: run %s stopped before its turn ended (%s); it is left running, "
                   "as a dead process leaves it: guard.recover(graph, config) unwinds it, "
                   "graph.invoke(None, config) resumes it", run_id, type(exc).__name__)


def _starting_run(frame: FrameType | None) -> tuple[Any, Any]:
    """The compiled graph whose run is starting and LangGraph's loop for that run (``None`` if
    not found), or ``(None, None)`` if this ``get_tuple`` is no run's start.

    The loop calls ``get_tuple`` from its ``__enter__`` inside ``Pregel.stream``/``astream``
    (``invoke`` runs ``stream``), so the loop and the graph are the ``self`` of frames a few
    levels up; ``get_state`` and other reads go through other methods."""
    loop_type = _loop_type()
    loop = None
    for _ in range(_FRAMES):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if loop_type is not None and loop is None and isinstance(owner, loop_type):
            loop = owner
        if isinstance(owner, Pregel):
            if frame.f_code.co_name in ("stream", "astream"):
                return owner, loop
            break
        frame = frame.f_back
    return None, None


def _loop_type() -> type | None:
    try:
        found = getattr(importlib.import_module(_LOOP_MODULE), _LOOP_CLASS)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None
