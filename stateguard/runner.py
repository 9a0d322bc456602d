"""The guard's runner: run graphs as sagas, and settle the end of each turn.

Every entry point takes the run's lease first (``RunLocked`` if another process holds it), runs
the graph with ``durability="sync"``, and on a failure unwinds before it raises ``SagaAborted``.
How a turn ends (held for an operator, unwound, paused, succeeded) is decided here for the
runner and for plain ``graph.invoke`` calls alike (``stateguard.plain_runs``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command

from stateguard.blame import STORE_ATTR
from stateguard.conversation import aanswer_tool_calls, answer_tool_calls
from stateguard.effects import EffectLedger
from stateguard.events import Event, emit
from stateguard.exceptions import (
    ApprovalRejected,
    ConfigurationError,
    InvalidRunState,
    InvariantViolation,
    RunLocked,
    RunNotFound,
    RunTerminated,
    SagaAborted,
)
from stateguard.history import expanded
from stateguard.instrument import RUNNER_KEY, instrument_graph
from stateguard.journal import TurnJournal, turn_steps
from stateguard.lifecycle import NEXT_TURN
from stateguard.malformed_calls import malformed_call_violation
from stateguard.records import ApprovalStatus, RunStatus, RunView
from stateguard.report import UnwindReport
from stateguard.state import state_values

if TYPE_CHECKING:
    from stateguard.core import GuardCore

logger = logging.getLogger("stateguard")

OUTPUT_IS_STATE_KEY = "__stateguard_output_is_state"
# The channel an @entrypoint keeps its ``previous`` value in (every checkpoint of one shows it).
_PREVIOUS = "__previous__"
ErrorPolicy = Literal["compensate", "hold"]
# What a node's error does: unwind the run, hold it for an operator, or ask a function.
OnError = ErrorPolicy | Callable[[BaseException], ErrorPolicy]


def run_id_of(config: RunnableConfig) -> str:
    configurable = config.get("configurable") if isinstance(config, dict) else None
    thread_id = configurable.get("thread_id") if isinstance(configurable, dict) else None
    if thread_id in (None, ""):
        raise ConfigurationError('config needs {"configurable": {"thread_id": ...}}')
    return str(thread_id)


def values_of(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig
              ) -> dict[str, Any] | None:
    """The thread's state, for compensations whose step journaled none; ``None`` if it cannot
    be read. The unwind calls this lazily, in its middle: it must not raise there, since the
    saver may be the very thing that failed."""
    try:
        return state_values(graph.get_state(config).values)
    except Exception:
        logger.warning("reading the state of %s for its compensations failed",
                       run_id_of(config), exc_info=True)
        return None


def paused_tasks(snapshot: Any) -> set[str]:
    """The ids of the tasks a checkpoint waits on (paused by an interrupt)."""
    return {t.id for t in snapshot.tasks if t.interrupts}


def task_of(step_id: str) -> str:
    """The LangGraph task a step ran in: a tool call's step id is ``<task id>:<call id>``."""
    return step_id.split(":", 1)[0]


def runner_config(config: RunnableConfig) -> RunnableConfig:
    return {**config, "configurable": {**config.get("configurable", {}), RUNNER_KEY: True}}


def _split_output(out: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    paused = ("__interrupt__",) if "__interrupt__" in out else ()
    return paused, {k: v for k, v in out.items() if k != "__interrupt__"}


def is_entrypoint(graph: Any) -> bool:
    """Whether ``graph`` is an ``@entrypoint`` (a ``Pregel`` no ``StateGraph`` built: its one
    node runs the function, and its state is the function's last return value)."""
    return isinstance(graph, Pregel) and not isinstance(getattr(graph, "builder", None),
                                                        StateGraph) and _PREVIOUS in graph.channels


def _builder_of(graph: Any) -> Any:
    """The builder of a compiled graph, else ``graph`` itself."""
    built = getattr(graph, "builder", None) if isinstance(graph, Pregel) else None
    return built if isinstance(built, StateGraph) else graph


class GuardRunner:
    core: GuardCore
    on_error: OnError
    saver: BaseCheckpointSaver[Any]  # the wrapped one

    # -- building ---------------------------------------------------------------------------
    def compile(self, builder: StateGraph[Any, Any, Any, Any] | Pregel[Any, Any, Any, Any],
                **kwargs: Any) -> Pregel[Any, Any, Any, Any]:
        """Compile ``builder`` with this checkpointer and wrap its nodes now (``builder.compile(
        checkpointer=guard)`` wraps them when the graph first runs; the two are the same graph).

        A compiled graph (``create_react_agent(...)`` returns one) is compiled again from its
        builder; pass the compile options it needs (``store=``, ``name=``...) here. An
        ``@entrypoint`` (no builder) is copied with this guard as its checkpointer."""
        if "checkpointer" in kwargs:
            raise ConfigurationError("compile() sets the checkpointer itself")
        if isinstance(builder, Pregel) and is_entrypoint(builder):
            return self._compile_entrypoint(builder, kwargs)
        builder = _builder_of(builder)
        if not isinstance(builder, StateGraph):
            raise ConfigurationError(f"expected a StateGraph builder, got {builder!r}")
        graph = builder.compile(checkpointer=self, **kwargs)  # type: ignore[arg-type]
        instrument_graph(graph, self.core)
        # When the output is the whole state and only interrupt() pauses the graph, the run's
        # end can be judged from the output, saving a checkpoint read per run.
        output_is_state = builder.output_schema is builder.state_schema and not (
            kwargs.get("interrupt_before") or kwargs.get("interrupt_after"))
        return graph.with_config(configurable={OUTPUT_IS_STATE_KEY: output_is_state})

    def _compile_entrypoint(self, workflow: Pregel[Any, Any, Any, Any],
                            kwargs: dict[str, Any]) -> Pregel[Any, Any, Any, Any]:
        """An ``@entrypoint`` (LangGraph's Functional API) has no builder to compile again: a
        copy of it with this guard as its checkpointer, its node wrapped now."""
        if kwargs:
            raise ConfigurationError(f"an @entrypoint takes no compile options: {sorted(kwargs)}"
                                     "; give them to @entrypoint(...)")
        graph = workflow.copy(update={"checkpointer": self})
        instrument_graph(graph, self.core)
        return graph

    def _check_graph(self, graph: Any) -> None:
        """Refuse a graph this guard is not the checkpointer of; wrap the nodes of one compiled
        with it (``builder.compile(checkpointer=guard)``) that has not run yet."""
        saver = getattr(graph, "checkpointer", None) if isinstance(graph, Pregel) else None
        if getattr(saver, "core", None) is not self.core:
            raise ConfigurationError("run graphs compiled with this guard: guard.compile(builder) "
                                     "or builder.compile(checkpointer=guard)")
        instrument_graph(graph, self.core)

    # -- running ----------------------------------------------------------------------------
    def invoke(self, graph: Pregel[Any, Any, Any, Any], input: Any, config: RunnableConfig,
               **kwargs: Any) -> Any:
        """Run ``graph`` as a new saga. Returns the output (with ``__interrupt__`` when paused
        for an approval); raises ``SagaAborted`` after unwinding when the run fails.

        Each invoke of a thread is a turn, a saga of its own: once a turn succeeded or was
        compensated, the next invoke starts a new turn, and an unwind undoes that turn's steps
        only. A turn that failed (held), paused or needs attention is continued with
        ``approve``, ``retry`` or ``compensate`` instead (``InvalidRunState``). A turn paused by
        the graph's own ``interrupt()`` is resumed with ``invoke(graph, Command(resume=...))``.

        Cancelled (``ainvoke``'s task), or stopped by ``KeyboardInterrupt``, a run is left as a
        dead process leaves it: ``running``, its lease released, a step maybe in doubt; the web
        app's sweeper, or ``recover``, takes it over.
        """
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id):  # creates the run if it is new
            paused = (paused_tasks(graph.get_state(config)) if isinstance(input, Command)
                      else set())
            self._start(run_id, config, input, paused)
            return self._run(graph, input, config, kwargs)

    async def ainvoke(self, graph: Pregel[Any, Any, Any, Any], input: Any,
                      config: RunnableConfig, **kwargs: Any) -> Any:
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id):
            paused = (paused_tasks(await graph.aget_state(config)) if isinstance(input, Command)
                      else set())
            self._start(run_id, config, input, paused)
            return await self._arun(graph, input, config, kwargs)

    def _begin(self, graph: Any, input: Any, config: RunnableConfig,
               kwargs: dict[str, Any]) -> str:
        self._check_graph(graph)
        reserved = sorted(set(kwargs) & {"durability", "checkpoint_during", "config"})
        if reserved:
            raise ConfigurationError(f"the guard sets {reserved} itself")
        return run_id_of(config)

    def _start(self, run_id: str, config: RunnableConfig, input: Any, paused: set[str]) -> None:
        """Begin the turn ``input`` starts; ``paused``: the tasks the thread's last checkpoint
        waits on, when ``input`` resumes them (a ``Command``)."""
        run = self._run_record(run_id)
        journal = self.core.journal
        if isinstance(input, Command):
            if run.status != RunStatus.PAUSED:
                raise InvalidRunState(f"run {run_id!r} is {run.status}; only a paused run is "
                                      "resumed with a Command")
            self.refuse_gated_resume(run_id, paused)
            self.core.set_status(run_id, RunStatus.RUNNING)
            return
        # PENDING: queued by the web app; RUNNING with no step: just created by the lease. A
        # journal that writes step rows with the checkpoint may have lost the row of a step
        # that ran: there the thread must have no checkpoint either.
        if run.status == RunStatus.PENDING:
            self.core.set_status(run_id, RunStatus.RUNNING)
        elif run.status in NEXT_TURN and isinstance(journal, TurnJournal):
            # A later turn of a conversation: a saga of its own (the finished turn is settled).
            journal.run_next_turn(run_id)
            emit(self.core.on_event, Event("run.status", run_id,
                                           data={"status": str(RunStatus.RUNNING)}))
        elif run.status != RunStatus.RUNNING or turn_steps(journal, run_id, run) or (
                getattr(journal, "defers_steps", False)
                and self.saver.get_tuple(config) is not None):
            raise InvalidRunState(f"run {run_id!r} already ran ({run.status}); use approve, "
                                  "retry or compensate, or a new thread_id")
        else:  # already marked running: tell live views without writing it again
            emit(self.core.on_event, Event("run.status", run_id,
                                           data={"status": str(RunStatus.RUNNING)}))

    def refuse_gated_resume(self, run_id: str, paused: set[str]) -> None:
        """A turn paused by the graph's own ``interrupt()`` goes on with the user's answer; an
        approval gate (a node's or a tool call's) is decided by ``approve``/``reject`` only,
        never by a resume value (the gate would pause again anyway)."""
        gated = sorted({a.node for a in self.core.journal.approvals(run_id)
                        if task_of(a.step_id) in paused and a.status == ApprovalStatus.PENDING})
        if gated:
            raise InvalidRunState(f"run {run_id!r} waits for the approval of {gated}: decide "
                                  "it with guard.approve() or guard.reject(), not with a "
                                  "Command")

    def _run(self, graph: Pregel[Any, Any, Any, Any], input: Any, config: RunnableConfig,
             kwargs: dict[str, Any]) -> Any:
        config = runner_config(config)
        failure: Exception | None = None
        try:
            out = graph.invoke(input, config, durability="sync", **kwargs)
        except Exception as exc:
            failure = exc
        # Unwound outside the except clause: a compensation's error does not carry the run's
        # error as its context (its traceback is in the cause, once).
        if failure is not None:
            report = self.unwind_failed(graph, config, failure)
            if report is None:
                raise failure
            raise SagaAborted(failure, report) from failure
        next_nodes, values = self._ending(graph, config, out)
        violation = self.settle(config, next_nodes, values)
        if violation is not None:
            report = self.unwind_violation(graph, config, violation, values)
            raise SagaAborted(violation, report) from violation
        return out

    async def _arun(self, graph: Pregel[Any, Any, Any, Any], input: Any,
                    config: RunnableConfig, kwargs: dict[str, Any]) -> Any:
        config = runner_config(config)
        failure: Exception | None = None
        try:
            out = await self._cancellable(graph.ainvoke(input, config, durability="sync",
                                                        **kwargs), run_id_of(config))
        except Exception as exc:
            failure = exc
        if failure is not None:
            report = await self.aunwind_failed(graph, config, failure)
            if report is None:
                raise failure
            raise SagaAborted(failure, report) from failure
        if self._output_is_state(graph, out):
            next_nodes, values = _split_output(out)
        else:
            snapshot = await graph.aget_state(config)
            next_nodes, values = snapshot.next, snapshot.values
        violation = self.settle(config, next_nodes, values)
        if violation is not None:
            report = await self.aunwind_violation(graph, config, violation, values)
            raise SagaAborted(violation, report) from violation
        return out

    async def _cancellable(self, running: Any, run_id: str) -> Any:
        """Await the graph's run as a task of its own, which an operator's stop cancels at
        once (``stateguard.stops``): the step it is in stays started, in doubt, as a cancelled
        ``ainvoke`` leaves it. Then ``RunTerminated``; a cancellation of the caller's is
        the caller's."""
        task = asyncio.ensure_future(running)
        loop = asyncio.get_running_loop()
        def cancel() -> None:
            loop.call_soon_threadsafe(task.cancel)

        with self.core.stops.cancelling(run_id, cancel):
            try:
                return await task
            except asyncio.CancelledError:
                stop = self.core.stops.get(run_id)
                current = asyncio.current_task()
                if stop is None or (current is not None and current.cancelling()):
                    raise
                raise RunTerminated(run_id, stop) from None

    @staticmethod
    def _output_is_state(graph: Pregel[Any, Any, Any, Any], out: Any) -> bool:
        conf = (graph.config or {}).get("configurable", {})
        return bool(conf.get(OUTPUT_IS_STATE_KEY)) and isinstance(out, dict)

    def _ending(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, out: Any
                ) -> tuple[tuple[str, ...], Any]:
        """Whether the run paused, and its final state."""
        if self._output_is_state(graph, out):
            return _split_output(out)
        snapshot = graph.get_state(config)
        return snapshot.next, snapshot.values

    # -- the end of a turn (the runner's, and a plain invoke's) ------------------------------
    def unwind_failed(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                      exc: Exception) -> UnwindReport | None:
        """A turn that raised ``exc``: held for an operator (``None``), or unwound; stopped by an
        operator (``RunTerminated``): unwound or held, as they chose."""
        if isinstance(exc, RunTerminated):
            return self.terminated(graph, config, exc)
        if self._hold(config, exc):
            return None
        cause = self.core.cause_of(exc)
        report = self.core.unwind(run_id_of(config), cause, include_in_doubt=True,
                                  fallback_state=lambda: values_of(graph, config))
        answer_tool_calls(graph, config, cause, report)
        return report

    async def aunwind_failed(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                             exc: Exception) -> UnwindReport | None:
        if isinstance(exc, RunTerminated):
            return await self.aterminated(graph, config, exc)
        if self._hold(config, exc):
            return None
        state = await self._astate(config, graph)
        cause = self.core.cause_of(exc)
        report = await self.core.aunwind(run_id_of(config), cause, include_in_doubt=True,
                                         fallback_state=state)
        await aanswer_tool_calls(graph, config, cause, report)
        return report

    def terminated(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                   exc: RunTerminated) -> UnwindReport:
        """A run an operator stopped (``stateguard.stops``): held ``needs_attention`` with
        their reason, or unwound (``ctx.reason == "terminated"``), the steps in doubt too (an
        async step cancelled mid-body); past its pivot it is held all the same
        (``GuardCore.unwind``). The request is then done."""
        run_id, stop = run_id_of(config), exc.stop
        cause = self.core.cause_of(exc)
        if stop.then == "hold":
            report = self.core.hold(run_id, cause, stop.describe())
        else:
            report = self.core.unwind(run_id, cause, include_in_doubt=True,
                                      triggered_by=stop.by or "operator",
                                      fallback_state=lambda: values_of(graph, config))
            answer_tool_calls(graph, config, cause, report)
        self.core.stopped(run_id, stop)
        return report

    async def aterminated(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                          exc: RunTerminated) -> UnwindReport:
        run_id, stop = run_id_of(config), exc.stop
        cause = self.core.cause_of(exc)
        if stop.then == "hold":
            report = self.core.hold(run_id, cause, stop.describe())
        else:
            report = await self.core.aunwind(
                run_id, cause, include_in_doubt=True, triggered_by=stop.by or "operator",
                fallback_state=await self._astate(config, graph))
            await aanswer_tool_calls(graph, config, cause, report)
        self.core.stopped(run_id, stop)
        return report

    @staticmethod
    async def _astate(config: RunnableConfig, graph: Pregel[Any, Any, Any, Any]) -> Any:
        try:
            return state_values((await graph.aget_state(config)).values)
        except Exception:  # as in values_of: the unwind must not depend on this read
            logger.warning("reading the state of %s for its compensations failed",
                           run_id_of(config), exc_info=True)
            return None

    def unwind_violation(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                         violation: InvariantViolation, values: Any) -> UnwindReport:
        """A turn whose final state broke an invariant (parallel writes of its last step)."""
        cause = self.core.cause_of(violation)
        report = self.core.unwind(run_id_of(config), cause,
                                  fallback_state=state_values(values))
        answer_tool_calls(graph, config, cause, report)
        return report

    async def aunwind_violation(self, graph: Pregel[Any, Any, Any, Any],
                                config: RunnableConfig, violation: InvariantViolation,
                                values: Any) -> UnwindReport:
        cause = self.core.cause_of(violation)
        report = await self.core.aunwind(run_id_of(config), cause,
                                         fallback_state=state_values(values))
        await aanswer_tool_calls(graph, config, cause, report)
        return report

    def _hold(self, config: RunnableConfig, exc: Exception) -> bool:
        """Whether to leave the run for an operator instead of unwinding it now.

        - a lost lease: the run belongs to whoever took it over;
        - the store's error (the saver's or the journal's, ``stateguard.blame``): nothing says
          the saga failed, so it is held ``failed`` for an operator to retry or compensate;
        - the graph's error (a node's, its router's, LangGraph's judging the run: past its
          recursion limit, a timeout) when ``on_error`` says "hold" (or its function does for
          this error)."""
        if isinstance(exc, RunLocked):
            return True
        if isinstance(exc, (InvariantViolation, ApprovalRejected)):
            return False
        if not getattr(exc, STORE_ATTR, False) and self._error_policy(exc) == "compensate":
            return False
        self.core.set_status(run_id_of(config), RunStatus.FAILED, self.core.cause_of(exc).error)
        return True

    def _error_policy(self, exc: Exception) -> ErrorPolicy:
        if not callable(self.on_error):
            return self.on_error
        try:
            policy = self.on_error(exc)
        except Exception:  # a broken policy must not leave the saga half done: unwind
            logger.exception("on_error policy raised; unwinding the run")
            return "compensate"
        if policy not in ("compensate", "hold"):
            logger.error("on_error policy returned %r for %s; unwinding the run", policy,
                         type(exc).__name__)
            return "compensate"
        return policy

    def settle(self, config: RunnableConfig, next_nodes: tuple[str, ...],
               values: Any) -> InvariantViolation | None:
        """Paused, or finished: then check the final state once more, because each node's own
        check cannot see the combined writes of parallel nodes in the last superstep."""
        run_id = run_id_of(config)
        if next_nodes:
            self.core.set_status(run_id, RunStatus.PAUSED)
            return None
        found = self.core.spec.first_violation(state_values(values))
        if found is not None:
            return InvariantViolation(found[0].name, found[1], node=None, phase="at the end")
        malformed = malformed_call_violation(self.core, run_id, state_values(values))
        if malformed is not None:
            return malformed
        self.core.set_status(run_id, RunStatus.SUCCEEDED)
        return None

    # -- reading ----------------------------------------------------------------------------
    def status(self, config: RunnableConfig | str) -> RunView:
        run_id = config if isinstance(config, str) else run_id_of(config)
        journal = self.core.journal
        effects = journal.effects(run_id) if isinstance(journal, EffectLedger) else []
        # Each step with its whole state, as journaled against earlier steps' (history).
        return RunView(self._run_record(run_id), expanded(journal.steps(run_id)),
                       journal.compensations(run_id), journal.approvals(run_id), effects)

    def _run_record(self, run_id: str) -> Any:
        run = self.core.journal.run_get(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run
