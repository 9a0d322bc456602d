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
from stateguard.records import (
    ApprovalRecord,
    ApprovalStatus,
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
_RESUMABLE = frozenset({RunStatus.FAILED, RunStatus.RUNNING})
_CRASHED = frozenset({RunStatus.RUNNING, RunStatus.COMPENSATING})


def run_id_of(config: RunnableConfig) -> str:
    configurable = config.get("configurable") if isinstance(config, dict) else None
    thread_id = configurable.get("thread_id") if isinstance(configurable, dict) else None
    if thread_id in (None, ""):
        raise ConfigurationError('config needs {"configurable": {"thread_id": ...}}')
    return str(thread_id)


def _values(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> dict[str, Any]:
    return state_values(graph.get_state(config).values)


def _finished(graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> bool:
    """Whether the thread has a checkpoint and nothing left to run."""
    snapshot = graph.get_state(config)
    return snapshot.created_at is not None and not snapshot.next and not snapshot.tasks


def _split_output(out: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    paused = ("__interrupt__",) if "__interrupt__" in out else ()
    return paused, {k: v for k, v in out.items() if k != "__interrupt__"}


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
        if not isinstance(builder, StateGraph):
            raise ConfigurationError(f"expected a StateGraph builder, got {builder!r}")
        return instrument(builder, self.core)

    def compile(self, builder: StateGraph[Any, Any, Any, Any], **kwargs: Any
                ) -> Pregel[Any, Any, Any, Any]:
        """Instrument ``builder`` and compile it with this checkpointer and sync durability."""
        if "checkpointer" in kwargs:
            raise ConfigurationError("compile() sets the checkpointer itself")
        graph = self.instrument(builder).compile(checkpointer=self, **kwargs)  # type: ignore[arg-type]
        # When the output is the whole state and only interrupt() pauses the graph, the run's
        # end can be judged from the output, saving a checkpoint read per run.
        output_is_state = builder.output_schema is builder.state_schema and not (
            kwargs.get("interrupt_before") or kwargs.get("interrupt_after"))
        return graph.with_config(configurable={INSTRUMENTED_KEY: True,
                                               OUTPUT_IS_STATE_KEY: output_is_state,
                                               "__pregel_durability": "sync"})

    def _check_graph(self, graph: Any) -> None:
        ours = isinstance(graph, Pregel) and getattr(graph, "checkpointer", None) is self
        if not ours or not (graph.config or {}).get("configurable", {}).get(INSTRUMENTED_KEY):
            raise ConfigurationError(
                "run graphs built by this guard: graph = guard.compile(builder)")

    # -- running ----------------------------------------------------------------------------
    def invoke(self, graph: Pregel[Any, Any, Any, Any], input: Any, config: RunnableConfig,
               **kwargs: Any) -> Any:
        """Run ``graph`` as a new saga. Returns the output (with ``__interrupt__`` when paused
        for an approval); raises ``SagaAborted`` after unwinding when the run fails.

        A thread runs one saga: invoking a thread that already ran raises ``InvalidRunState``
        (continue it with ``approve``, ``retry`` or ``compensate`` instead; starting it again
        from its input would repeat every effect)."""
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id):  # creates the run if it is new
            self._start(run_id, config)
            return self._run(graph, input, config, kwargs)

    async def ainvoke(self, graph: Pregel[Any, Any, Any, Any], input: Any,
                      config: RunnableConfig, **kwargs: Any) -> Any:
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id):
            self._start(run_id, config)
            return await self._arun(graph, input, config, kwargs)

    def _begin(self, graph: Any, input: Any, config: RunnableConfig,
               kwargs: dict[str, Any]) -> str:
        self._check_graph(graph)
        if isinstance(input, Command):
            raise ConfigurationError("resume a paused run with guard.approve() or "
                                     "guard.reject(), not with a Command")
        reserved = sorted(set(kwargs) & {"durability", "checkpoint_during", "config"})
        if reserved:
            raise ConfigurationError(f"the guard sets {reserved} itself")
        return run_id_of(config)

    def _start(self, run_id: str, config: RunnableConfig) -> None:
        run = self._run_record(run_id)
        # PENDING: queued by the web app; RUNNING with no step: just created by the lease. A
        # journal that writes step rows with the checkpoint may have lost the row of a step
        # that ran: there the thread must have no checkpoint either.
        if run.status == RunStatus.PENDING:
            self.core.set_status(run_id, RunStatus.RUNNING)
        elif run.status != RunStatus.RUNNING or self.core.journal.steps(run_id) or (
                getattr(self.core.journal, "defers_steps", False)
                and self.saver.get_tuple(config) is not None):
            raise InvalidRunState(f"run {run_id!r} already ran ({run.status}); use approve, "
                                  "retry or compensate, or a new thread_id")
        else:  # already marked running: tell live views without writing it again
            emit(self.core.on_event, Event("run.status", run_id,
                                           data={"status": str(RunStatus.RUNNING)}))

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
            except Exception:  # the unwind must not depend on reading the checkpoint back
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
    def _pending(self, run_id: str, node: str | None, step_id: str | None
                 ) -> ApprovalRecord:
        pending = [a for a in self.core.journal.approvals(run_id)
                   if a.status == ApprovalStatus.PENDING and node in (None, a.node)
                   and step_id in (None, a.step_id)]
        if not pending:
            what = f" for node {node!r}" if node else ""
            raise InvalidRunState(f"run {run_id!r} has no pending approval{what}")
        if len(pending) > 1:
            raise InvalidRunState(f"run {run_id!r} has {len(pending)} pending approvals; "
                                  "name the step_id")
        return pending[0]

    def _check_paused(self, run_id: str) -> None:
        run = self._run_record(run_id)
        if run.status != RunStatus.PAUSED:
            raise InvalidRunState(f"run {run_id!r} is {run.status}; only a paused run waits "
                                  "for a decision")

    def _decide(self, run_id: str, approval: ApprovalRecord, status: ApprovalStatus,
                by: str | None, reason: str) -> None:
        if not self.core.journal.approval_decide(run_id, approval.step_id, status, by=by,
                                                 reason=reason):
            raise InvalidRunState(f"approval of {approval.node!r} was already decided")
        emit(self.core.on_event, Event("approval.decided", run_id, approval.node,
                                       approval.step_id, {"decision": str(status), "by": by}))

    def approve(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                by: str | None = None, node: str | None = None, step_id: str | None = None
                ) -> Any:
        """Approve the pending gate and resume the run; the gated node runs exactly once."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            self._check_paused(run_id)
            self._decide(run_id, self._pending(run_id, node, step_id), ApprovalStatus.APPROVED,
                         by, "")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return self._run(graph, None, config, {})

    async def aapprove(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                       by: str | None = None, node: str | None = None,
                       step_id: str | None = None) -> Any:
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            self._check_paused(run_id)
            self._decide(run_id, self._pending(run_id, node, step_id), ApprovalStatus.APPROVED,
                         by, "")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return await self._arun(graph, None, config, {})

    def reject(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
               by: str | None = None, node: str | None = None, step_id: str | None = None,
               reason: str = "") -> UnwindReport:
        """Reject the pending gate: the gated node never runs and the run is unwound."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            self._check_paused(run_id)
            approval = self._pending(run_id, node, step_id)
            self._decide(run_id, approval, ApprovalStatus.REJECTED, by, reason)
            exc = ApprovalRejected(approval.node, by=by, reason=reason)
            return self.core.unwind(run_id, self.core.cause_of(exc),
                                    triggered_by=by or "operator",
                                    fallback_state=lambda: _values(graph, config))

    def retry(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
              force: bool = False) -> Any:
        """Resume a failed (or crashed) run from where it stopped: ``invoke(None)`` semantics, so
        succeeded steps never run again; only the failed or unfinished task does.

        A step left in doubt by a dead process would run again, possibly repeating its effect:
        that needs ``force=True`` (for nodes known to be idempotent)."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            run = self._run_record(run_id)
            if run.status not in _RESUMABLE:
                raise InvalidRunState(f"run {run_id!r} is {run.status}; only a failed or "
                                      "crashed run can be retried")
            steps = self._reconcile(graph, config, run_id)
            if steps is None:
                steps = self.core.journal.steps(run_id)
            doubtful = [s.node for s in steps if s.status == StepStatus.STARTED]
            if doubtful and not force:
                raise InvalidRunState(f"run {run_id!r} has steps in doubt {doubtful}: resuming "
                                      "would run them again; compensate, or retry(force=True)")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return self._run(graph, None, config, {})

    def compensate(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                   by: str = "operator", reason: str = "operator") -> UnwindReport:
        """Unwind the run now (an operator's "compensate", or crash recovery). Idempotent:
        compensations that already succeeded are skipped. Steps left in doubt by a dead process
        are compensated only when their compensation is declared ``in_doubt_safe``."""
        self._check_graph(graph)
        run_id = self._run_record(run_id_of(config)).run_id
        with self.core.lease(run_id):
            # We hold the lease, so a step still "started" has lost its worker: it is in doubt.
            self._reconcile(graph, config, run_id)
            return self.core.unwind(run_id, Cause(reason), triggered_by=by,
                                    include_in_doubt=True,
                                    fallback_state=lambda: _values(graph, config))

    def _reconcile(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig,
                   run_id: str) -> list[StepRecord] | None:
        """Journal as started (in doubt) the steps whose rows a dead process took with it, and
        return the run's steps then (None: the journal has nothing to reconcile; read them).

        Only for journals that write step rows with the checkpoint (``defers_steps``): there a
        step's row commits with its task's writes, so a step the last checkpoint still lists as
        a pending task, with no writes and no row, may have run. Its body never ran if it was
        waiting for an approval that was not given."""
        journal = self.core.journal
        if not getattr(journal, "defers_steps", False):
            return None
        steps = journal.steps(run_id)
        known = {s.step_id for s in steps}
        approved = {a.step_id for a in journal.approvals(run_id)
                    if a.status == ApprovalStatus.APPROVED}
        nodes = getattr(getattr(graph, "builder", None), "nodes", {})
        for task in graph.get_state(config).tasks:
            if (task.id in known or task.error is not None or task.result is not None
                    or (task.interrupts and task.id not in approved)):
                continue
            spec = nodes.get(task.name)
            started, _ = journal.step_start(run_id, task.id, task.name,
                                            node_tags(spec.metadata) if spec is not None else ())
            steps.append(started)
        return steps

    def recover(self, graph: Pregel[Any, Any, Any, Any], config: RunnableConfig, *,
                resume: bool = False) -> Any:
        """Take over a run whose process died (its lease expired): unwind it, or resume it
        (``resume=True`` re-runs the step in doubt: only for idempotent nodes).

        A run whose graph had finished when its process died (it died before saying so) is
        settled as it would have been: its final state is checked, and it succeeds or unwinds
        on a violation. Unwinding it for the crash would undo a saga that completed."""
        run = self._run_record(run_id_of(config))
        if run.status not in _CRASHED:
            raise InvalidRunState(f"run {run.run_id!r} is {run.status}, not crashed")
        if run.status == RunStatus.RUNNING and (resume or _finished(graph, config)):
            return self.retry(graph, config, force=True)
        return self.compensate(graph, config, by="recovery", reason="crash")

    def status(self, config: RunnableConfig | str) -> RunView:
        run_id = config if isinstance(config, str) else run_id_of(config)
        journal = self.core.journal
        return RunView(self._run_record(run_id), journal.steps(run_id),
                       journal.compensations(run_id), journal.approvals(run_id))

    def _run_record(self, run_id: str) -> Any:
        run = self.core.journal.run_get(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run
