"""The drop-in path: ``builder.compile(checkpointer=guard)`` with a plain ``graph.invoke``.

Here StateGuard sees the run only through the checkpointer calls LangGraph makes on its background
threads, so it observes rather than instruments:
- ``put_writes`` of a task that finished -> a succeeded step (node from ``task_path``);
- ``put_writes`` carrying ``__interrupt__`` -> a paused step (the node called ``interrupt()``;
  LangGraph runs it again, from its start, when the run is resumed);
- ``put_writes`` carrying ``__error__`` -> the unwind runs right there, before LangGraph re-raises
  the node's exception to the caller (LangGraph waits for these calls before it raises), once the
  tasks still running beside it have finished (one unwind undoes them too), and the exception
  gets the report as ``exc.stateguard_report`` and as a note. Under ``ainvoke`` the unwind runs
  on the caller's event loop (async compensations use the app's own clients). An error written
  with state writes beside it (the node's body returned, then its router raised) is a step
  that had its effect;
- ``put`` of a new checkpoint -> invariants are checked on the committed state; a violation
  unwinds and raises ``InvariantViolation``. Under ``durability="sync"`` that stops the run before
  the next node. Under the default ``"async"`` LangGraph does not wait for ``put``, so later nodes
  may already be running: their steps are compensated as soon as they are observed, and
  StateGuard warns once. ``guard.compile(builder)`` enforces in every mode.

LangGraph runs these calls on a thread pool, so a call may overtake an earlier one: the observer
numbers each task's commit as LangGraph makes it and journals steps in that order
(``stateguard.dropin_order``), so compensations follow completion order.

What is kept for a run lives from its start until LangGraph's loop for the run has exited (or been
collected, for a start LangGraph rejected inside the loop's own ``__enter__``) and the run's last
observation call has returned: a second cancellation of ``ainvoke`` can end the loop's exit while an
``aput_writes`` is still running. A later invoke on the thread starts afresh from the checkpoint it
loads. A guard lives as long as the server, so nothing may outlive its run.

Finding the loop, and numbering its commits (its ``put_writes``, ``tasks`` and
``checkpoint_pending_writes``), relies on LangGraph internals (named below and in
``stateguard.dropin_order``; a test checks them against the pinned version). Should they move,
the observer still observes and logs once; a run is then forgotten when its loop is collected
or, without a loop, only beyond a cap on how many runs are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from stateguard.core import GuardCore
from stateguard.dropin_order import ORDER_TIMEOUT, SIBLING_TIMEOUT, CommitOrder
from stateguard.exceptions import ConfigurationError, InvalidRunState, InvariantViolation
from stateguard.instrument import INSTRUMENTED_KEY, RUNNER_KEY, node_tags
from stateguard.journal import TurnJournal, turn_steps
from stateguard.lifecycle import NEXT_TURN
from stateguard.records import RunStatus, StepStatus
from stateguard.report import UnwindReport
from stateguard.state import apply_update, is_internal_channel, state_values
from stateguard.subgraphs import mark_subgraphs
from stateguard.tools import install, tool_nodes, tools_of
from stateguard.unwind import Cause

_ERROR, _INTERRUPT = "__error__", "__interrupt__"
_ABORTED = frozenset({RunStatus.COMPENSATING, RunStatus.COMPENSATED, RunStatus.NEEDS_ATTENTION})
_DRAIN_TIMEOUT = 10.0
# A run's put_writes reads the checkpoint its step started from, at most a few steps back.
_VALUES_PER_RUN = 16
# A backstop for runs whose end is not seen (LangGraph's internals moved): beyond this many, the
# least recently active runs with no call in flight and no live loop are forgotten.
_MAX_RUNS = 10_000
# LangGraph internals: the class of the loop that calls get_tuple as a run starts, and its exit
# stack, which unwinds after the loop's executor has waited for the run's put/put_writes.
_LOOP_MODULE, _LOOP_CLASS, _LOOP_STACK = "langgraph.pregel._loop", "PregelLoop", "stack"

logger = logging.getLogger("stateguard")


class StateGuardWarning(UserWarning):
    """StateGuard is running in a mode where some of its guarantees do not hold."""


def attach_report(exc: BaseException, report: UnwindReport) -> None:
    with contextlib.suppress(AttributeError):  # exceptions with __slots__ only get the note
        exc.stateguard_report = report  # type: ignore[attr-defined]
    exc.add_note(f"StateGuard: {report}")


@dataclass(eq=False)
class _Run:
    nodes: dict[str, tuple[str, ...]]  # node -> tags, of the graph this run runs
    channels: Mapping[str, Any]
    values: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)  # by checkpoint
    # A checkpoint raised a violation: LangGraph saves no later one, so nothing may wait for one.
    stopped: bool = False
    loop: weakref.ref[Any] | None = None  # LangGraph's loop running it, if found
    ended: bool = False  # that loop exited or was collected: forget it once no call is in flight
    paused: bool = False  # a node called interrupt(): the turn waits for a resume
    observing: bool = False  # the drop-in form (else a guarded graph invoked without its runner)
    order: CommitOrder | None = None  # the order LangGraph committed its tasks in
    unwinding: bool = False  # an unwind of this run was claimed (by its first failure)
    cause: Cause | None = None  # why, once claimed
    report: UnwindReport | None = None  # what it did, once done

    def alive(self) -> bool:
        """Its loop may still make calls (unknown without a loop: the cap decides)."""
        return not self.ended and self.loop is not None and self.loop() is not None


@dataclass(eq=False)
class _Unwind:
    """An unwind an observation call asks for, carried out by its sync or async caller (an
    async compensation then runs on the caller's event loop: an app's clients are bound to it).

    ``lead``: this call unwinds the run; otherwise another failure of the run does, and this one
    waits for its report. ``late``: a step observed after its run was unwound, undone by an
    unwind of its own if the first one could not see it."""

    run_id: str
    live: _Run
    cause: Cause
    error: BaseException | None  # gets the report (and is what the caller raises, if it does)
    state: Any = None
    lead: bool = True
    late: str | None = None  # the late step's id
    # Wait for the tasks running beside the failed one (not for a checkpoint's violation:
    # under "async" durability the tasks running then belong to later steps).
    siblings: bool = True


class DropInObserver:
    def __init__(self, core: GuardCore) -> None:
        self.core = core
        self._cond = threading.Condition()
        self._in_flight: dict[str, int] = {}
        self._warned = False
        # Weak, and by the graph itself: an id() is handed on once its graph is collected.
        self._graphs: weakref.WeakKeyDictionary[
            Any, tuple[dict[str, tuple[str, ...]], Mapping[str, Any]]] = (
            weakref.WeakKeyDictionary())
        self._runs: OrderedDict[str, _Run] = OrderedDict()  # by run id, least recently active first
        self._degraded = False

    @staticmethod
    def mode(config: RunnableConfig) -> str | None:
        """"observe" (drop-in), "errors" (a guarded graph invoked without the guard's runner:
        the wrappers journal steps, this unwinds on a failure), or None (the runner does all)."""
        conf = config.get("configurable", {})
        if conf.get(RUNNER_KEY) or conf.get("checkpoint_ns"):
            return None
        return "errors" if conf.get(INSTRUMENTED_KEY) else "observe"

    # -- run start (from get_tuple, called by LangGraph as a run begins) ----------------------
    def on_run_start(self, config: RunnableConfig, saved: CheckpointTuple | None) -> None:
        mode = self.mode(config)
        if mode is None:
            return
        graph, loop = self._starting_run(sys._getframe(1))
        if graph is None:
            return  # get_state() and other reads, not a run
        run_id = str(config.get("configurable", {}).get("thread_id"))
        nodes, channels = self._learn_graph(graph)
        if mode == "observe":  # a guarded graph's turns are the runner's to keep
            paused = self._next_turn(run_id)
            self._admit(config)
            if paused:  # resumed: running again, so that _end_turn records how it ends
                self.core.set_status(run_id, RunStatus.RUNNING)
        # A resumed step's writes name the checkpoint loaded here, saved by an earlier invoke.
        live = _Run(nodes, channels, order=CommitOrder(self._cond), observing=mode == "observe")
        if saved is not None:
            live.values[saved.checkpoint["id"]] = state_values(saved.checkpoint["channel_values"])
        if loop is not None:
            self._follow(loop, run_id, live)
        with self._cond:
            self._runs[run_id] = live
            self._runs.move_to_end(run_id)
            if len(self._runs) > _MAX_RUNS:
                self._evict()

    def _follow(self, loop: Any, run_id: str, live: _Run) -> None:
        """Number the loop's commits (``stateguard.dropin_order``). End ``live`` when its loop
        exits or, if it never does (LangGraph rejected the start inside the loop's
        ``__enter__``), when the loop is collected."""
        if live.order is not None and not live.order.hook(loop):
            self._degrade(f"LangGraph's {_LOOP_CLASS} has no put_writes to follow",
                          "as before; steps are journaled in the order their writes arrive")
        collected: weakref.finalize[[str, _Run], None] | None = None
        try:
            live.loop = weakref.ref(loop)
            # Its callback holds no reference to the loop, or the loop would never be collected.
            collected = weakref.finalize(loop, self._run_ended, run_id, live)
            collected.atexit = False
        except TypeError:  # a loop that cannot be weakly referenced
            live.loop = None
            self._degrade(f"LangGraph's {_LOOP_CLASS} cannot be weakly referenced",
                          f"when its loop exits (a rejected start: beyond {_MAX_RUNS} runs)")
        callback = getattr(getattr(loop, _LOOP_STACK, None), "callback", None)
        if callable(callback):
            # Pushed before LangGraph enters its background executor, so this runs after the
            # executor has waited for the run's last put/put_writes (or was cancelled doing so).
            callback(self._loop_exited, run_id, live, collected)
        else:
            self._degrade(f"LangGraph's {_LOOP_CLASS} has no exit stack {_LOOP_STACK!r}",
                          "once LangGraph's loop is collected")

    def _loop_exited(self, run_id: str, live: _Run,
                     collected: weakref.finalize[[str, _Run], None] | None) -> None:
        if collected is not None:
            collected.detach()
        try:
            self._end_turn(run_id, live)
        except Exception:  # an exit callback must not replace what the run raised
            logger.exception("StateGuard drop-in: recording the end of run %s failed", run_id)
        self._run_ended(run_id, live)

    def _end_turn(self, run_id: str, live: _Run) -> None:
        """The run's turn is over: it succeeded (settled: a later turn never undoes it), or it
        paused; an unwound or failed one already says so. LangGraph's loop tells which."""
        loop = live.loop() if live.loop is not None else None
        ended = getattr(loop, "status", None) if live.observing else None
        if ended == "done":
            status = RunStatus.SUCCEEDED
        elif live.paused or ended in ("interrupt_before", "interrupt_after"):
            status = RunStatus.PAUSED
        else:
            return
        run = self.core.journal.run_get(run_id)
        if run is not None and run.status == RunStatus.RUNNING:
            self.core.set_status(run_id, status)

    def _run_ended(self, run_id: str, live: _Run) -> None:
        with self._cond:
            live.ended = True
            self._forget_if_done(run_id)

    def forget(self, run_id: str) -> None:
        """Drop what is kept for the run (its thread was deleted)."""
        with self._cond:
            self._runs.pop(run_id, None)

    # The two below run with the lock held. The lock is re-entrant, and a loop's finalizer may
    # run on a thread that holds it (a garbage collection starts at any allocation): so they
    # never iterate the dict itself, and tolerate an entry vanishing under them.
    def _forget_if_done(self, run_id: str) -> None:
        """Drop the run's record if its loop has ended and none of its calls is in flight (a
        second cancellation ends the loop's exit without waiting for its calls)."""
        live = self._runs.get(run_id)
        if live is not None and live.ended and run_id not in self._in_flight:
            self._runs.pop(run_id, None)

    def _evict(self) -> None:
        """Forget the least recently active runs beyond the cap that can make no more calls;
        never a run with a call in flight or a live loop (one blocked in a long node)."""
        for run_id in list(self._runs):  # keys only: nothing allocated while iterating
            if len(self._runs) <= _MAX_RUNS:
                return
            live = self._runs.get(run_id)
            if live is not None and run_id not in self._in_flight and not live.alive():
                self._runs.pop(run_id, None)

    def _degrade(self, what: str, forgotten: str) -> None:
        if not self._degraded:  # once per guard, not on every invoke
            self._degraded = True
            logger.warning("StateGuard drop-in: %s (LangGraph internals moved?). Runs are still "
                           "observed; what is kept for one is forgotten %s.", what, forgotten)

    def _next_turn(self, run_id: str) -> bool:
        """A thread whose last turn finished starts a new turn (a saga of its own): invoked
        again with input, or with ``None`` after ``update_state`` (resuming after a fix).
        True if the thread's turn is paused: this invoke resumes it (or, with input, starts a
        new one)."""
        journal = self.core.journal
        run = journal.run_get(run_id)
        if run is None:
            return False
        if run.status in (RunStatus.COMPENSATING, RunStatus.NEEDS_ATTENTION):
            raise InvalidRunState(
                f"run {run_id!r} is {run.status}: an effect is still being undone, or could "
                "not be undone and waits for an operator; continue once it is settled")
        if run.status not in NEXT_TURN:
            # paused, or cut short: this invoke goes on with its turn
            return run.status == RunStatus.PAUSED
        if not isinstance(journal, TurnJournal):
            raise InvalidRunState(
                f"run {run_id!r} finished ({run.status}) and this journal keeps one saga per "
                "thread: start a new thread_id")
        journal.run_next_turn(run_id)
        return False

    def _admit(self, config: RunnableConfig) -> None:
        if self.core.spec.approvals:
            raise ConfigurationError(
                "approval gates need the guarded path: graph = guard.compile(builder)")
        durability = config.get("configurable", {}).get("__pregel_durability", "async")
        if durability != "sync" and not self._warned:
            self._warned = True
            warnings.warn(
                f"StateGuard drop-in mode with durability={durability!r}: node errors are "
                "compensated, but an invariant violation cannot stop nodes that already started "
                "(they are compensated when observed). Use graph = guard.compile(builder), or "
                "invoke with durability='sync', to stop the run before the next node.",
                StateGuardWarning, stacklevel=3)

    def _starting_run(self, frame: FrameType | None) -> tuple[Any, Any]:
        """The compiled graph whose run is starting and LangGraph's loop for that run (or
        ``None``), or ``(None, None)`` if this is not a run start.

        The checkpointer is never told which graph it serves; LangGraph calls ``get_tuple`` from
        its loop's ``__enter__`` inside ``Pregel.stream``/``astream`` as a run begins, so the
        loop and the graph are the ``self`` of frames a few levels up (``get_state`` reads go
        through other methods)."""
        from langgraph.pregel import Pregel

        loop_type = self._loop_type()
        loop = None
        for _ in range(40):
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

    def _loop_type(self) -> type | None:
        try:
            found = getattr(importlib.import_module(_LOOP_MODULE), _LOOP_CLASS)
        except (ImportError, AttributeError):
            found = None
        if not isinstance(found, type):
            self._degrade(f"{_LOOP_MODULE}.{_LOOP_CLASS} was not found",
                          f"only beyond {_MAX_RUNS} runs, least recently active first")
            return None
        return found

    def _learn_graph(self, graph: Any) -> tuple[dict[str, tuple[str, ...]], Mapping[str, Any]]:
        """Validate the guard's names against the graph, and return its tags and reducers
        (several graphs may share one guard)."""
        with self._cond:
            known = self._graphs.get(graph)
        if known is None:
            runnables = {name: node.bound for name, node in graph.nodes.items()}
            nodes = mark_subgraphs(self.core.spec,
                                   {name: node_tags(node.metadata) for name, node
                                    in graph.nodes.items() if not name.startswith("__")},
                                   runnables)
            with_tools = tool_nodes(runnables)
            self.core.spec.validate_names(nodes, tools_of(with_tools))
            for tool_node in with_tools.values():
                install(tool_node, graph.channels)  # tool calls are steps (stateguard.tools)
            known = (nodes, graph.channels)
            with self._cond:
                self._graphs[graph] = known
        return known

    # -- ordering ---------------------------------------------------------------------------
    @contextmanager
    def tracking(self, run_id: str) -> Iterator[None]:
        with self._cond:
            self._in_flight[run_id] = self._in_flight.get(run_id, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._in_flight[run_id] - 1
                if left:
                    self._in_flight[run_id] = left
                else:
                    del self._in_flight[run_id]
                    self._forget_if_done(run_id)  # the last call of a run whose loop ended
                self._cond.notify_all()

    def _drain(self, run_id: str) -> None:
        """Wait until this call is the run's only observation call still running."""
        with self._cond:
            self._cond.wait_for(lambda: self._in_flight.get(run_id, 0) <= 1,
                                timeout=_DRAIN_TIMEOUT)

    def _state_of(self, run_id: str, checkpoint_id: str | None) -> dict[str, Any]:
        with self._cond:
            live = self._runs.get(run_id)
            if live is None:
                return {}
            self._cond.wait_for(lambda: checkpoint_id in live.values or live.stopped,
                                timeout=_DRAIN_TIMEOUT)
            return dict(live.values.get(checkpoint_id or "", {}))

    # -- observations -----------------------------------------------------------------------
    def before_put(self, config: RunnableConfig, checkpoint: Mapping[str, Any],
                   metadata: Mapping[str, Any]) -> None:
        """Refuse an ``update_state`` outside a run that breaks an invariant, before it is
        saved. It is no step of the saga: no node is to blame and nothing is to be undone
        (unwinding for it would refund a finished run's charge)."""
        if metadata.get("source") != "update" or self.mode(config) != "observe":
            return
        with self._cond:
            if str(config["configurable"]["thread_id"]) in self._runs:
                return  # a run's own update: checked as its step
        found = self.core.spec.first_violation(state_values(checkpoint["channel_values"]))
        if found is not None:
            raise InvariantViolation(found[0].name, f"{found[1]} (update_state refused)")

    def after_put(self, config: RunnableConfig, checkpoint: Mapping[str, Any],
                  metadata: Mapping[str, Any]) -> _Unwind | None:
        """Observe a saved checkpoint; an invariant it breaks asks for an unwind, after which
        the caller raises its ``error``."""
        run_id = str(config["configurable"]["thread_id"])
        values = state_values(checkpoint["channel_values"])
        with self._cond:
            live = self._runs.get(run_id)  # None outside a run: update_state()
            if live is not None:
                self._runs.move_to_end(run_id)
                live.values[checkpoint["id"]] = values
                while len(live.values) > _VALUES_PER_RUN:
                    live.values.popitem(last=False)
                self._cond.notify_all()
        order = live.order if live is not None else None
        if order is not None and order.hooked:
            # The steps that led to this checkpoint are journaled before it is done: under
            # "sync" LangGraph waits for it before the next node, so a process that dies in that
            # node leaves every step before it journaled (recovery finds that node in doubt).
            order.wait(lambda: order.observed_before(checkpoint["id"]), ORDER_TIMEOUT,
                       f"the steps of {run_id}")
        journal = self.core.journal
        if metadata.get("source") == "input":
            run = journal.run_get(run_id)
            if run is None:
                journal.run_begin(run_id)
            elif (isinstance(journal, TurnJournal) and self.mode(config) == "observe"
                  and turn_steps(journal, run_id, run)):
                # New input on a thread whose turn paused or was cut short: LangGraph starts
                # from START again, so this is a new turn, and the old one is left as it is.
                journal.run_next_turn(run_id)
                return None
            journal.run_set_status(run_id, RunStatus.RUNNING)
            return None
        if live is None or int(metadata.get("step", 0)) < 0 or self.mode(config) != "observe":
            return None  # update_state() outside a run was checked before it was saved
        found = self.core.spec.first_violation(values)
        if found is None:
            return None
        with self._cond:
            live.stopped = True
            lead, live.unwinding = not live.unwinding, True
            self._cond.notify_all()
        # Every task that led to this checkpoint was journaled above, in its order.
        if order is None or not order.hooked:
            self._drain(run_id)
        done = [s for s in turn_steps(journal, run_id) if s.done_seq is not None]
        last = max(done, key=lambda s: s.done_seq or 0).node if done else None
        exc = InvariantViolation(found[0].name, found[1], node=last)
        return self._claimed(_Unwind(run_id, live, self.core.cause_of(exc), exc, values, lead,
                                     siblings=False))

    def _send_failed(self, live: _Run, config: RunnableConfig,
                     writes: Sequence[tuple[str, Any]]) -> _Unwind | None:
        """A ``Send`` task's error unwinds the run like a node's (v2 agents run each tool call
        as a ``Send`` task). Its path names no node; the tool-call wrapper journaled its step
        and named the tool on the error."""
        error = next((v for c, v in writes if c == _ERROR), None)
        if error is None or self.mode(config) is None:
            return None
        if not isinstance(error, BaseException):
            error = RuntimeError(str(error))
        conf = config["configurable"]
        run_id = str(conf["thread_id"])
        with self._cond:
            lead, live.unwinding = not live.unwinding, True
        state = self._state_of(run_id, conf.get("checkpoint_id"))
        return self._claimed(_Unwind(run_id, live, self.core.cause_of(error), error, state,
                                     lead))

    def after_put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                         task_id: str, task_path: str) -> _Unwind | None:
        """Journal the step whose writes were saved; a failure asks for an unwind."""
        run_id = str(config["configurable"]["thread_id"])
        live = self._runs.get(run_id) or _Run({}, {})
        try:
            return self._observe_writes(live, config, writes, task_id, task_path)
        finally:
            if live.order is not None:
                live.order.observed(task_id)  # the next task in LangGraph's order may go on

    def _observe_writes(self, live: _Run, config: RunnableConfig,
                        writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
                        ) -> _Unwind | None:
        node = task_path.rsplit(", ", 1)[-1] if task_path.startswith("~__pregel_pull") else ""
        conf = config["configurable"]
        run_id = str(conf["thread_id"])
        observing = self.mode(config) == "observe"  # else the node wrappers journal the steps
        named = bool(node) and not node.startswith("__")
        if any(c == _INTERRUPT for c, _ in writes):
            live.paused = True
            if observing and named:  # interrupt() in the body: it runs again on resume
                self.core.journal.step_start(run_id, task_id, node, live.nodes.get(node, ()))
                self.core.journal.step_finish(run_id, task_id, StepStatus.PAUSED)
            return None
        if not node and task_path.startswith("~__pregel_push"):
            return self._send_failed(live, config, writes)
        if not named:
            return None
        journal, tags = self.core.journal, live.nodes.get(node, ())
        error = next((v for c, v in writes if c == _ERROR), None)
        if observing:
            journal.step_start(run_id, task_id, node, tags)
        update = {c: v for c, v in writes if not is_internal_channel(c)}
        if error is not None:
            if not isinstance(error, BaseException):
                error = RuntimeError(str(error))
            if observing:
                self._failed(live, run_id, task_id, update, conf.get("checkpoint_id"), error)
            with self._cond:
                lead, live.unwinding = not live.unwinding, True
            state = self._state_of(run_id, conf.get("checkpoint_id"))
            return self._claimed(_Unwind(run_id, live,
                                         self.core.cause_of(error, failed_node=node), error,
                                         state, lead))
        if not observing:
            return None
        before = self._state_of(run_id, conf.get("checkpoint_id"))
        after = apply_update(live.channels, before, update)
        journal.step_finish(run_id, task_id, StepStatus.SUCCEEDED, update=update,
                            state_after=after)
        run = journal.run_get(run_id)
        if run is not None and run.status in _ABORTED:
            # Under "async" a node can finish after the run was unwound: undo it too.
            cause = live.cause or self.core.cause_of(None, failed_node=node, reason="invariant")
            return _Unwind(run_id, live, cause, None, lead=False, late=task_id)
        return None

    def _failed(self, live: _Run, run_id: str, task_id: str, update: dict[str, Any],
                checkpoint_id: str | None, error: BaseException) -> None:
        """Journal a failed task. Writes to the state beside the error mean the node's body
        returned and what came after it in the task raised (its router, say): the effect
        happened, so the step is undone like one that broke an invariant."""
        info = self.core.cause_of(error).error
        if not update:
            self.core.journal.step_finish(run_id, task_id, StepStatus.FAILED, error=info)
            return
        after = apply_update(live.channels, self._state_of(run_id, checkpoint_id), update)
        self.core.journal.step_finish(run_id, task_id, StepStatus.VIOLATED, update=update,
                                      state_after=after, error=info)

    def _claimed(self, unwind: _Unwind) -> _Unwind:
        if unwind.lead:
            unwind.live.cause = unwind.cause
        return unwind

    # -- carrying out an unwind (sync and async twins) ----------------------------------------
    def wait_turn(self, run_id: str, task_id: str) -> None:
        """Wait until every task LangGraph committed before ``task_id`` was observed."""
        order = self._order_of(run_id)
        if order is not None:
            order.wait(lambda: order.ready(task_id), ORDER_TIMEOUT, f"the steps before {task_id}")

    async def await_turn(self, run_id: str, task_id: str) -> None:
        order = self._order_of(run_id)
        if order is not None:
            await order.await_(lambda: order.ready(task_id), ORDER_TIMEOUT,
                               f"the steps before {task_id}")

    def _order_of(self, run_id: str) -> CommitOrder | None:
        live = self._runs.get(run_id)
        return live.order if live is not None and live.order is not None and (
            live.order.hooked) else None

    def settle(self, unwind: _Unwind) -> None:
        live, order = unwind.live, unwind.live.order
        if unwind.lead and unwind.late is None:
            if order is None or not order.hooked:
                self._drain(unwind.run_id)
            elif unwind.siblings:
                order.wait(order.siblings_observed, SIBLING_TIMEOUT,
                           f"the tasks running beside the failure of {unwind.run_id}")
            self._reported(unwind, self.core.unwind(unwind.run_id, unwind.cause,
                                                    fallback_state=unwind.state))
            return
        if order is not None and order.hooked and live.unwinding:
            order.wait(lambda: live.report is not None, SIBLING_TIMEOUT,
                       f"the unwind of {unwind.run_id}")
        else:
            self._drain(unwind.run_id)
        if self._missed(unwind):
            self._reported(unwind, self.core.unwind(unwind.run_id, unwind.cause))
        elif unwind.error is not None and live.report is not None:
            attach_report(unwind.error, live.report)

    async def asettle(self, unwind: _Unwind) -> None:
        live, order = unwind.live, unwind.live.order
        if unwind.lead and unwind.late is None:
            if order is None or not order.hooked:
                await asyncio.to_thread(self._drain, unwind.run_id)
            elif unwind.siblings:
                await order.await_(order.siblings_observed, SIBLING_TIMEOUT,
                                   f"the tasks running beside the failure of {unwind.run_id}")
            self._reported(unwind, await self.core.aunwind(unwind.run_id, unwind.cause,
                                                           fallback_state=unwind.state))
            return
        if order is not None and order.hooked and live.unwinding:
            await order.await_(lambda: live.report is not None, SIBLING_TIMEOUT,
                               f"the unwind of {unwind.run_id}")
        else:
            await asyncio.to_thread(self._drain, unwind.run_id)
        if await asyncio.to_thread(self._missed, unwind):
            self._reported(unwind, await self.core.aunwind(unwind.run_id, unwind.cause))
        elif unwind.error is not None and live.report is not None:
            attach_report(unwind.error, live.report)

    def _missed(self, unwind: _Unwind) -> bool:
        """Whether a late step has no compensation record: the run's unwind did not see it."""
        return unwind.late is not None and not any(
            c.step_id == unwind.late for c in self.core.journal.compensations(unwind.run_id))

    def _reported(self, unwind: _Unwind, report: UnwindReport) -> None:
        with self._cond:
            if unwind.live.report is None:
                unwind.live.report = report
            self._cond.notify_all()
        if unwind.error is not None:
            attach_report(unwind.error, report)
