"""The guarded path: compile with instrumentation and run graphs as sagas.

Every entry point takes the run's lease first (``RunLocked`` if another process holds it), runs
the graph with ``durability="sync"``, and on a failure unwinds before it raises ``SagaAborted``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command

from stateguard.effects import EffectLedger
from stateguard.events import Event, emit
from stateguard.exceptions import (
    ApprovalRejected,
    ConfigurationError,
    InvalidRunState,
    InvariantViolation,
    RunLocked,
    RunNotFound,
    SagaAborted,
)
from stateguard.instrument import INSTRUMENTED_KEY, NODE_ATTR, RUNNER_KEY, instrument, node_tags
from stateguard.journal import TurnJournal, turn_steps
from stateguard.lifecycle import NEXT_TURN, Action, check
from stateguard.records import (
    ApprovalRecord,
    ApprovalStatus,
    CompensationStatus,
    RunRecord,
    RunStatus,
    RunView,
    StepRecord,
    StepStatus,
)
from stateguard.report import UnwindReport
from stateguard.state import state_values
from stateguard.unwind import Cause

if TYPE_CHECKING:
    from stateguard.core import GuardCore

logger = logging.getLogger("stateguard")

OUTPUT_IS_STATE_KEY = "__stateguard_output_is_state"
ErrorPolicy = Literal["compensate", "hold"]
# What a node's error does: unwind the run, hold it for an operator, or ask a function.
OnError = ErrorPolicy | Callable[[BaseException], ErrorPolicy]


def run_id_of(config: RunnableConfig) -> str:
    configurable = config.get("configurable") if isinstance(config, dict) else None
    thread_id = configurable.get("thread_id") if isinstance(configurable, dict) else None
    if thread_id in (None, ""):
        raise ConfigurationError('config needs {"configurable": {"thread_id": ...}}')
    return str(thread_id)


def _values(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> dict[str, Any] | None:
    """The thread's state, for compensations whose step journaled none; ``None`` if it cannot
    be read. The unwind calls this lazily, in its middle: it must not raise there, since the
    saver may be the very thing that failed."""
    try:
        return state_values(graph.get_state(config).values)
    except Exception:
        logger.warning("reading the state of %s for its compensations failed",
                       run_id_of(config), exc_info=True)
        return None


def _paused(snapshot: Any) -> set[str]:
    """The ids of the tasks a checkpoint waits on (paused by an interrupt)."""
    return {t.id for t in snapshot.tasks if t.interrupts}


def _ran(task: Any) -> bool:
    """Whether a task of a checkpoint ran: LangGraph saved its writes, with no error and no
    interrupt (a task with writes has a result, ``{}`` when it wrote nothing to the state)."""
    return task.result is not None and task.error is None and not task.interrupts


def _split_output(out: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    paused = ("__interrupt__",) if "__interrupt__" in out else ()
    return paused, {k: v for k, v in out.items() if k != "__interrupt__"}


def _builder_of(graph: Any) -> Any:
    """The builder of a compiled graph, else ``graph`` itself."""
    built = getattr(graph, "builder", None) if isinstance(graph, Pregel) else None
    return built if isinstance(built, StateGraph) else graph


def _task_of(step_id: str) -> str:
    """The LangGraph task a step ran in: a tool call's step id is ``<task id>:<call id>``."""
    return step_id.split(":", 1)[0]


def _instrumented(graph: Any) -> bool:
    """Built by ``guard.compile`` (else compiled with the guard as its checkpointer: drop-in)."""
    return bool((graph.config or {}).get("configurable", {}).get(INSTRUMENTED_KEY))


def _runner_config(config: RunnableConfig) -> RunnableConfig:
    return {**config, "configurable": {**config.get("configurable", {}), RUNNER_KEY: True}}


class GuardRunner:
    core: GuardCore
    on_error: OnError
    saver: BaseCheckpointSaver[Any]  # the wrapped one

    # -- building ---------------------------------------------------------------------------
    def instrument(self, builder: StateGraph[Any, Any, Any, Any]
                   ) -> StateGraph[Any, Any, Any, Any]:
        """A copy of ``builder`` with every node wrapped (see ``stateguard.instrument``)."""
        builder = _builder_of(builder)
        if not isinstance(builder, StateGraph):
            raise ConfigurationError(f"expected a StateGraph builder, got {builder!r}")
        return instrument(builder, self.core)

    def compile(self, builder: StateGraph[Any, Any, Any, Any], **kwargs: Any
                ) -> Pregel[Any, Any, Any, Any]:
        """Instrument ``builder`` and compile it with this checkpointer and sync durability.

        A compiled graph (``create_react_agent(...)`` returns one) is compiled again from its
        builder; pass the compile options it needs (``store=``, ``name=``...) here."""
        if "checkpointer" in kwargs:
            raise ConfigurationError("compile() sets the checkpointer itself")
        builder = _builder_of(builder)
        graph = self.instrument(builder).compile(checkpointer=self, **kwargs)  # type: ignore[arg-type]
        # When the output is the whole state and only interrupt() pauses the graph, the run's
        # end can be judged from the output, saving a checkpoint read per run.
        output_is_state = builder.output_schema is builder.state_schema and not (
            kwargs.get("interrupt_before") or kwargs.get("interrupt_after"))
        return graph.with_config(configurable={INSTRUMENTED_KEY: True,
                                               OUTPUT_IS_STATE_KEY: output_is_state,
                                               "__pregel_durability": "sync"})

    def _check_graph(self, graph: Any, *, drop_in: bool = False) -> None:
        """Refuse a graph this guard did not build (``drop_in``: or compile, as a checkpointer:
        recovery unwinds a drop-in run too)."""
        ours = isinstance(graph, Pregel) and getattr(graph, "checkpointer", None) is self
        if not ours or not (_instrumented(graph) or drop_in):
            raise ConfigurationError(
                "run graphs built by this guard: graph = guard.compile(builder)")

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
        """
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id):  # creates the run if it is new
            self._start(run_id, config, graph, input)
            return self._run(graph, input, config, kwargs)

    async def ainvoke(self, graph: Pregel[Any, Any, Any, Any], input: Any,
                      config: RunnableConfig, **kwargs: Any) -> Any:
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id):
            self._start(run_id, config, graph, input)
            return await self._arun(graph, input, config, kwargs)

    def _begin(self, graph: Any, input: Any, config: RunnableConfig,
               kwargs: dict[str, Any]) -> str:
        self._check_graph(graph)
        reserved = sorted(set(kwargs) & {"durability", "checkpoint_during", "config"})
        if reserved:
            raise ConfigurationError(f"the guard sets {reserved} itself")
        return run_id_of(config)

    def _start(self, run_id: str, config: RunnableConfig, graph: Pregel[Any, Any, Any, Any],
               input: Any) -> None:
        run = self._run_record(run_id)
        journal = self.core.journal
        if isinstance(input, Command):
            self._resume_interrupt(run, config, graph)
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

    def _resume_interrupt(self, run: RunRecord, config: RunnableConfig,
                          graph: Pregel[Any, Any, Any, Any]) -> None:
        """A turn paused by the graph's own ``interrupt()`` goes on with the user's answer; an
        approval gate is decided by ``approve``/``reject`` only, never by a resume value."""
        if run.status != RunStatus.PAUSED:
            raise InvalidRunState(f"run {run.run_id!r} is {run.status}; only a paused run is "
                                  "resumed with a Command")
        paused = _paused(graph.get_state(config))
        gated = sorted({a.node for a in self.core.journal.approvals(run.run_id)
                        if a.step_id in paused and a.status == ApprovalStatus.PENDING})
        if gated:
            raise ConfigurationError(f"run {run.run_id!r} waits for the approval of {gated}: "
                                     "decide it with guard.approve() or guard.reject(), not "
                                     "with a Command")
        self.core.set_status(run.run_id, RunStatus.RUNNING)

    def _run(self, graph: Pregel[Any, Any, Any, Any], input: Any, config: RunnableConfig,
             kwargs: dict[str, Any]) -> Any:
        config = _runner_config(config)
        try:
            out = graph.invoke(input, config, durability="sync", **kwargs)
        except Exception as exc:
            if self._hold(config, exc):
                raise
            report = self.core.unwind(run_id_of(config), self.core.cause_of(exc),
                                      include_in_doubt=True,
                                      fallback_state=lambda: _values(graph, config))
            raise SagaAborted(exc, report) from exc
        next_nodes, values = self._ending(graph, config, out)
        violation = self._settle(config, next_nodes, values)
        if violation is not None:
            report = self.core.unwind(run_id_of(config), self.core.cause_of(violation),
                                      fallback_state=state_values(values))
            raise SagaAborted(violation, report) from violation
        return out

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

    async def _arun(self, graph: Pregel[Any, Any, Any, Any], input: Any,
                    config: RunnableConfig, kwargs: dict[str, Any]) -> Any:
        config = _runner_config(config)
        try:
            out = await graph.ainvoke(input, config, durability="sync", **kwargs)
        except Exception as exc:
            if self._hold(config, exc):
                raise
            try:
                state: Any = state_values((await graph.aget_state(config)).values)
            except Exception:  # as in _values: the unwind must not depend on this read
                logger.warning("reading the state of %s for its compensations failed",
                               run_id_of(config), exc_info=True)
                state = None
            report = await self.core.aunwind(run_id_of(config), self.core.cause_of(exc),
                                             include_in_doubt=True, fallback_state=state)
            raise SagaAborted(exc, report) from exc
        if self._output_is_state(graph, out):
            next_nodes, values = _split_output(out)
        else:
            snapshot = await graph.aget_state(config)
            next_nodes, values = snapshot.next, snapshot.values
        violation = self._settle(config, next_nodes, values)
        if violation is not None:
            report = await self.core.aunwind(run_id_of(config), self.core.cause_of(violation),
                                             fallback_state=state_values(values))
            raise SagaAborted(violation, report) from violation
        return out

    def _hold(self, config: RunnableConfig, exc: Exception) -> bool:
        """Whether to leave the run for an operator instead of unwinding it now.

        - a lost lease: the run belongs to whoever took it over;
        - an error that did not come from a node (LangGraph's own, a saver's): nothing says the
          saga failed, so it is held ``failed`` for an operator to retry or compensate;
        - a node's error when ``on_error`` says "hold" (or its function does for this error)."""
        if isinstance(exc, RunLocked):
            return True
        if isinstance(exc, (InvariantViolation, ApprovalRejected)):
            return False
        if getattr(exc, NODE_ATTR, None) and self._error_policy(exc) == "compensate":
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

    def _settle(self, config: RunnableConfig, next_nodes: tuple[str, ...],
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
        self.core.set_status(run_id, RunStatus.SUCCEEDED)
        return None

    # -- operator actions -------------------------------------------------------------------
    def _approval(self, paused: set[str], run_id: str, node: str | None, step_id: str | None,
                  decision: ApprovalStatus, by: str | None, reason: str) -> ApprovalRecord:
        """The approval to carry ``decision`` out on, decided now if it was pending; ``paused``
        holds the ids of the tasks the run's last checkpoint waits on.

        It may have been decided already, by whoever took the decision (the web app decides in
        its request, atomically, and leaves the resuming to a worker): then it is carried out
        as decided, and a different decision is refused."""
        matching = [a for a in self.core.journal.approvals(run_id)
                    if _task_of(a.step_id) in paused and node in (None, a.node)
                    and step_id in (None, a.step_id)]
        what = f" for node {node!r}" if node else ""
        pending = [a for a in matching if a.status == ApprovalStatus.PENDING]
        if len(pending) > 1:
            raise InvalidRunState(f"run {run_id!r} has {len(pending)} pending approvals{what}; "
                                  "name the step_id")
        if pending:
            approval = pending[0]
            if not self.core.journal.approval_decide(run_id, approval.step_id, decision,
                                                     by=by, reason=reason):
                raise InvalidRunState(f"approval of {approval.node!r} was already decided")
            emit(self.core.on_event, Event("approval.decided", run_id, approval.node,
                                           approval.step_id,
                                           {"decision": str(decision), "by": by}))
            return approval
        decided = [a for a in matching if step_id is not None and a.step_id == step_id]
        if not decided:
            raise InvalidRunState(f"run {run_id!r} has no pending approval{what}")
        if decided[0].status != decision:
            raise InvalidRunState(f"approval of {decided[0].node!r} was already "
                                  f"{decided[0].status}")
        return decided[0]

    def approve(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                by: str | None = None, node: str | None = None, step_id: str | None = None
                ) -> Any:
        """Approve the pending gate and resume the run; the gated node runs exactly once.

        An approval already approved (decided elsewhere, ``step_id`` naming it) is carried out."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            check(Action.APPROVE, self._run_record(run_id).status, run=run_id)
            self._approval(_paused(graph.get_state(config)), run_id, node, step_id,
                           ApprovalStatus.APPROVED, by, "")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return self._run(graph, None, config, {})

    async def aapprove(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                       by: str | None = None, node: str | None = None,
                       step_id: str | None = None) -> Any:
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            check(Action.APPROVE, self._run_record(run_id).status, run=run_id)
            self._approval(_paused(await graph.aget_state(config)), run_id, node, step_id,
                           ApprovalStatus.APPROVED, by, "")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return await self._arun(graph, None, config, {})

    def reject(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
               by: str | None = None, node: str | None = None, step_id: str | None = None,
               reason: str = "") -> UnwindReport:
        """Reject the pending gate: the gated node never runs and the run is unwound.

        An approval already rejected (decided elsewhere, ``step_id`` naming it) is carried out."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            check(Action.REJECT, self._run_record(run_id).status, run=run_id)
            approval = self._approval(_paused(graph.get_state(config)), run_id, node, step_id,
                                      ApprovalStatus.REJECTED, by, reason)
            exc = ApprovalRejected(approval.node, by=approval.decided_by or by,
                                   reason=approval.reason or reason)
            return self.core.unwind(run_id, self.core.cause_of(exc),
                                    triggered_by=by or "operator",
                                    fallback_state=lambda: _values(graph, config))

    def retry(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
              force: bool = False) -> Any:
        """Resume a failed run from where it stopped: ``invoke(None)`` semantics, so succeeded
        steps never run again; only the failed or unfinished task does.

        A step left in doubt by a dead process would run again, possibly repeating its effect:
        that needs ``force=True`` (for nodes known to be idempotent). A run whose process died
        is taken over with ``recover``."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            check(Action.RETRY, self._run_record(run_id).status, run=run_id)
            return self._resume(graph, config, run_id, force)

    def _resume(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, run_id: str,
                force: bool) -> Any:
        steps = self._reconcile(graph, config, run_id)
        doubtful = [s.node for s in steps if s.status == StepStatus.STARTED]
        if doubtful and not force:
            raise InvalidRunState(f"run {run_id!r} has steps in doubt {doubtful}: resuming "
                                  "would run them again; compensate, or retry(force=True)")
        self.core.set_status(run_id, RunStatus.RUNNING)
        return self._run(graph, None, config, {})

    def compensate(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                   by: str = "operator", reason: str = "operator") -> UnwindReport:
        """Unwind the run now (an operator's "compensate"). Compensations that already
        succeeded are skipped, so on a run that needs attention it retries the failed ones.
        Steps left in doubt by a dead process are compensated only when their compensation is
        declared ``in_doubt_safe``.

        The run's status is checked under its lease: a run resolved by hand, or taken up by
        another action, since the operator asked is refused (``InvalidRunState``)."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            check(Action.COMPENSATE, self._run_record(run_id).status, run=run_id)
            return self._compensate(graph, config, run_id, by, reason)

    def retry_compensation(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                           step_id: str, *, by: str = "operator") -> UnwindReport:
        """Run one compensation that failed (or was skipped for a step in doubt) again: fresh
        attempts, the same idempotency key. The others are left as they are, and the run ends
        ``compensated`` only if none is left failed."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            check(Action.RETRY_COMPENSATION, self._run_record(run_id).status, run=run_id)
            record = next((c for c in self.core.journal.compensations(run_id)
                           if c.step_id == step_id), None)
            if record is None or record.status not in (CompensationStatus.FAILED,
                                                       CompensationStatus.SKIPPED_IN_DOUBT):
                status = record.status if record else "not there"
                raise InvalidRunState(f"the compensation of step {step_id!r} is {status}; only "
                                      "a failed or skipped-in-doubt compensation is retried")
            return self.core.unwind(run_id, Cause("operator"), triggered_by=by,
                                    include_in_doubt=True, only=step_id,
                                    fallback_state=lambda: _values(graph, config))

    def _compensate(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                    run_id: str, by: str, reason: str, *, reconcile: bool = True
                    ) -> UnwindReport:
        # We hold the lease, so a step still "started" has lost its worker: it is in doubt.
        if reconcile:
            self._reconcile(graph, config, run_id)
        return self.core.unwind(run_id, Cause(reason), triggered_by=by, include_in_doubt=True,
                                fallback_state=lambda: _values(graph, config))

    def _reconcile(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                   run_id: str) -> list[StepRecord]:
        """Make the journal's steps agree with the last checkpoint, and return them.

        - A task whose writes LangGraph saved (with no error or interrupt) has run: its
          effect happened. If its step is still "started" (the process died between the two
          writes), it is journaled succeeded, so that it is compensated, not taken for in
          doubt, nor run again.
        - With a journal that writes step rows with the checkpoint (``defers_steps``), a step's
          row commits with its task's writes, so a task the last checkpoint still lists, with no
          writes and no row, may have run: it is journaled started (in doubt). Not a task that
          paused: it paused in a first run, whose rows travel with that pause's writes, and a
          resumed run writes its rows before each body (so an approved step that started has
          one)."""
        journal = self.core.journal
        steps = journal.steps(run_id)
        by_id = {s.step_id: s for s in steps}
        nodes = getattr(getattr(graph, "builder", None), "nodes", {})
        changed = False
        for task in graph.get_state(config).tasks:
            step = by_id.get(task.id)
            if _ran(task):
                if step is not None and step.status == StepStatus.STARTED:
                    journal.step_finish(run_id, task.id, StepStatus.SUCCEEDED,
                                        update=task.result)
                    changed = True
                continue
            # Steps journaled after their writes (a deferring journal, or the drop-in form) have
            # no row for a task that was running when the process died.
            late_rows = getattr(journal, "defers_steps", False) or not _instrumented(graph)
            if step is not None or not late_rows or task.error is not None or task.interrupts:
                continue
            spec = nodes.get(task.name)
            journal.step_start(run_id, task.id, task.name,
                               node_tags(spec.metadata) if spec is not None else ())
            changed = True
        return journal.steps(run_id) if changed else steps

    def recover(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                resume: bool = False) -> Any:
        """Take over a run whose process died (its lease expired): unwind it, or resume it
        (``resume=True`` re-runs the step in doubt: only for idempotent nodes).

        A run whose graph had finished when its process died (it died before saying so, maybe
        before LangGraph's last checkpoint) is settled as it would have been: its final state is
        checked, and it succeeds or unwinds on a violation. Unwinding it for the crash would
        undo a saga that completed.

        A drop-in run (``builder.compile(checkpointer=guard)``) whose process died is unwound
        the same way; the task it was running has no journal row (the drop-in form journals a
        step once LangGraph saved its writes), so it is found in the last checkpoint and taken
        to be in doubt. Resuming one is ``graph.invoke(None, config)``, not ``resume=True``."""
        self._check_graph(graph, drop_in=not resume)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            run = self._run_record(run_id)
            check(Action.RECOVER, run.status, run=run_id)
            # Against the checkpoint the dead process left: _finished may write the next one,
            # whose new tasks never started.
            self._reconcile(graph, config, run_id)
            if run.status == RunStatus.RUNNING and (resume or self._finished(graph, config)):
                return self._resume(graph, config, run_id, force=True)
            if run.status == RunStatus.RUNNING and self._pausing(graph, config, run_id):
                # It died after pausing at a gate, before saying so: it waits for a decision.
                self.core.set_status(run_id, RunStatus.PAUSED)
                return None
            return self._compensate(graph, config, run_id, "recovery", "crash", reconcile=False)

    def _pausing(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                 run_id: str) -> bool:
        """Whether the last checkpoint waits on approval gates whose approvals are still
        pending, every other task of it having run: the run had paused for an operator. (A
        gate whose approval was given since is not waiting: its body may have started.)"""
        snapshot = graph.get_state(config)
        pending = {_task_of(a.step_id) for a in self.core.journal.approvals(run_id)
                   if a.status == ApprovalStatus.PENDING}
        gates = [t for t in snapshot.tasks if t.interrupts]
        return bool(gates) and all(t.id in pending for t in gates) and all(
            t.interrupts or _ran(t) for t in snapshot.tasks)

    def _finished(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> bool:
        """Whether the thread's graph has nothing left to run.

        The last checkpoint may list tasks whose writes were saved (the process died before the
        checkpoint that applies them). Those tasks ran; whether the graph goes on after them
        depends on what they wrote, so their writes are applied (stopping before any node) and
        the checkpoint that results is asked."""
        snapshot = graph.get_state(config)
        if snapshot.created_at is None or snapshot.next:
            return False
        if not snapshot.tasks:
            return True
        if not all(_ran(task) for task in snapshot.tasks):
            return False
        graph.invoke(None, _runner_config(config), durability="sync", interrupt_before="*")
        after = graph.get_state(config)
        return not after.next and not after.tasks

    def status(self, config: RunnableConfig | str) -> RunView:
        run_id = config if isinstance(config, str) else run_id_of(config)
        journal = self.core.journal
        effects = journal.effects(run_id) if isinstance(journal, EffectLedger) else []
        return RunView(self._run_record(run_id), journal.steps(run_id),
                       journal.compensations(run_id), journal.approvals(run_id), effects)

    def _run_record(self, run_id: str) -> Any:
        run = self.core.journal.run_get(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run
