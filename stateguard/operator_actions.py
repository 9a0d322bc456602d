"""What an operator (or a recovery worker) does to a run: approve or reject its gate, retry it,
compensate it, retry one compensation, resolve it by hand, terminate it, recover it after a
crash.

Each takes the run's lease and checks the action against the run's status under it
(``stateguard.lifecycle``), so a run settled by someone else meanwhile is refused
(``InvalidRunState``), never overwritten. They work on any graph whose checkpointer is the guard,
whichever form compiled it. Each has an async twin (``aapprove``, ``areject``...) for callers on
an event loop, whose saver may be async only; ``recover`` is sync (recovery workers are).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel

from stateguard.conversation import aanswer_tool_calls, answer_tool_calls
from stateguard.events import Event, emit
from stateguard.exceptions import (
    ApprovalRejected,
    ConfigurationError,
    InvalidRunState,
    RunTerminated,
    SagaAborted,
)
from stateguard.instrument import node_tags
from stateguard.journal import turn_steps
from stateguard.kinds import StepKind, pivot_of, pivot_state
from stateguard.lifecycle import Action, Pivot, check
from stateguard.records import (
    RETRYABLE_COMPENSATIONS,
    ApprovalRecord,
    ApprovalStatus,
    CompensationStatus,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
)
from stateguard.report import UnwindReport
from stateguard.rewind import (
    Rewind,
    find_step,
    fork_node,
    live_steps,
    plan_rewind,
    undone,
    validate_update,
)
from stateguard.runner import (
    paused_tasks,
    run_id_of,
    runner_config,
    task_of,
    values_of,
)
from stateguard.state import state_values
from stateguard.stops import StopRequest, Then
from stateguard.streaming import GuardStreaming
from stateguard.unwind import Cause

Graph = Pregel[Any, Any, Any, Any]


def _target(from_node: str | None, from_tool_call: str | None, from_step: str | None,
            update: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A retry's earlier step, as ``rewind.find_step`` takes it; ``None``: from its failure."""
    target = {k: v for k, v in (("from_node", from_node), ("from_tool_call", from_tool_call),
                                ("from_step", from_step)) if v is not None}
    if not target and update is not None:
        raise ConfigurationError("update is applied by a retry from an earlier step: give "
                                 "from_node, from_tool_call or from_step with it")
    return target or None


def _ran(task: Any) -> bool:
    """Whether a task of a checkpoint ran: LangGraph saved its writes, with no error and no
    interrupt (a task with writes has a result, ``{}`` when it wrote nothing to the state)."""
    return task.result is not None and task.error is None and not task.interrupts


class GuardOperations(GuardStreaming):
    # -- approvals --------------------------------------------------------------------------
    def _approval(self, paused: set[str], run_id: str, node: str | None, step_id: str | None,
                  decision: ApprovalStatus, by: str | None, reason: str) -> ApprovalRecord:
        """The approval to carry ``decision`` out on, decided now if it was pending; ``paused``
        holds the ids of the tasks the run's last checkpoint waits on.

        It may have been decided already, by whoever took the decision (the web app decides in
        its request, atomically, and leaves the resuming to a worker): then it is carried out
        as decided, and a different decision is refused."""
        matching = [a for a in self.core.journal.approvals(run_id)
                    if task_of(a.step_id) in paused and node in (None, a.node)
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

    def _known_run(self, graph: Graph, config: RunnableConfig) -> str:
        """The run of ``config``'s thread (``RunNotFound`` if the journal has none), once
        ``graph`` is known to be this guard's."""
        self._check_graph(graph)
        return str(self._run_record(run_id_of(config)).run_id)

    def approve(self, graph: Graph, config: RunnableConfig, *, by: str | None = None,
                node: str | None = None, step_id: str | None = None) -> Any:
        """Approve the pending gate and resume the run; the gated node runs exactly once.

        An approval already approved (decided elsewhere, ``step_id`` naming it) is carried out."""
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.APPROVE, self._run_record(run_id).status, run=run_id)
            self._approval(paused_tasks(graph.get_state(config)), run_id, node, step_id,
                           ApprovalStatus.APPROVED, by, "")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return self._run(graph, None, config, {})

    async def aapprove(self, graph: Graph, config: RunnableConfig, *, by: str | None = None,
                       node: str | None = None, step_id: str | None = None) -> Any:
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.APPROVE, self._run_record(run_id).status, run=run_id)
            self._approval(paused_tasks(await graph.aget_state(config)), run_id, node, step_id,
                           ApprovalStatus.APPROVED, by, "")
            self.core.set_status(run_id, RunStatus.RUNNING)
            return await self._arun(graph, None, config, {})

    def reject(self, graph: Graph, config: RunnableConfig, *, by: str | None = None,
               node: str | None = None, step_id: str | None = None,
               reason: str = "") -> UnwindReport:
        """Reject the pending gate: the gated node never runs and the run is unwound.

        An approval already rejected (decided elsewhere, ``step_id`` naming it) is carried out."""
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.REJECT, self._run_record(run_id).status, run=run_id,
                  pivot=self._pivot(run_id))
            cause = self._rejection(paused_tasks(graph.get_state(config)), run_id, node,
                                    step_id, by, reason)
            report = self.core.unwind(run_id, cause, triggered_by=by or "operator",
                                      fallback_state=lambda: values_of(graph, config))
            answer_tool_calls(graph, config, cause, report)
            return report

    async def areject(self, graph: Graph, config: RunnableConfig, *, by: str | None = None,
                      node: str | None = None, step_id: str | None = None,
                      reason: str = "") -> UnwindReport:
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.REJECT, self._run_record(run_id).status, run=run_id,
                  pivot=self._pivot(run_id))
            snapshot = await graph.aget_state(config)
            cause = self._rejection(paused_tasks(snapshot), run_id, node, step_id, by, reason)
            report = await self.core.aunwind(run_id, cause, triggered_by=by or "operator",
                                             fallback_state=state_values(snapshot.values))
            await aanswer_tool_calls(graph, config, cause, report)
            return report

    def _rejection(self, paused: set[str], run_id: str, node: str | None,
                   step_id: str | None, by: str | None, reason: str) -> Cause:
        approval = self._approval(paused, run_id, node, step_id, ApprovalStatus.REJECTED, by,
                                  reason)
        return self.core.cause_of(ApprovalRejected(approval.node, by=approval.decided_by or by,
                                                   reason=approval.reason or reason))

    # -- retry --------------------------------------------------------------------------------
    def retry(self, graph: Graph, config: RunnableConfig, *, force: bool = False,
              from_node: str | None = None, from_tool_call: str | None = None,
              from_step: str | None = None, update: Mapping[str, Any] | None = None,
              by: str = "operator") -> Any:
        """Resume a failed run from where it stopped: ``invoke(None)`` semantics, so succeeded
        steps never run again; only the failed or unfinished task does.

        With ``from_node`` (its last run), ``from_tool_call`` (a call's id) or ``from_step`` (a
        step id), retry from that earlier step instead (``stateguard.rewind``): undo it and the
        steps after it, newest first (an unwind with reason ``operator``, by ``by``), then run
        again from the checkpoint before it, with ``update`` applied to the state. Refused
        across a pivot, and for a run partly undone (``lifecycle.Action.RETRY_FROM``).

        A run held ``needs_attention`` past its pivot (``stateguard.kinds``: a step after it
        failed past its retries, say), nothing of it undone, is resumed the same way: past the
        point of no return a run is recovered forward, never unwound. Not one that stopped
        inside its pivot, nor one partly undone (``stateguard.lifecycle.Pivot``).

        A step left in doubt by a dead process would run again, possibly repeating its effect:
        that needs ``force=True`` (for nodes known to be idempotent). A run whose process died
        is taken over with ``recover``."""
        target = _target(from_node, from_tool_call, from_step, update)
        if target is not None:
            return self._retry_from(graph, config, target, update, by, force)
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.RETRY, self._run_record(run_id).status, run=run_id,
                  pivot=self._pivot(run_id))
            self._refuse_doubt(self._reconcile(graph, graph.get_state(config), run_id), run_id,
                               force)
            self.core.set_status(run_id, RunStatus.RUNNING)
            return self._run(graph, None, config, {})

    async def aretry(self, graph: Graph, config: RunnableConfig, *, force: bool = False,
                     from_node: str | None = None, from_tool_call: str | None = None,
                     from_step: str | None = None, update: Mapping[str, Any] | None = None,
                     by: str = "operator") -> Any:
        target = _target(from_node, from_tool_call, from_step, update)
        if target is not None:
            return await self._aretry_from(graph, config, target, update, by, force)
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.RETRY, self._run_record(run_id).status, run=run_id,
                  pivot=self._pivot(run_id))
            self._refuse_doubt(self._reconcile(graph, await graph.aget_state(config), run_id),
                               run_id, force)
            self.core.set_status(run_id, RunStatus.RUNNING)
            return await self._arun(graph, None, config, {})

    def _rewind(self, graph: Graph, config: RunnableConfig, run_id: str, snapshot: Any,
                history: list[Any], target: dict[str, str], update: Mapping[str, Any] | None,
                force: bool) -> Rewind:
        """Check a retry from an earlier step, under the run's lease, before anything is
        written: the step, the rule (``lifecycle``), the update; the plan (``rewind``)."""
        run = self._run_record(run_id)
        steps = live_steps(self._reconcile(graph, snapshot, run_id), run.turn)
        step = find_step(steps, run=run_id, **target)
        plan = plan_rewind(history, steps, step, run=run_id)
        check(Action.RETRY_FROM, run.status, run=run_id, pivot=plan.pivot,
              undone=undone(steps, self.core.journal.compensations(run_id)))
        self._refuse_doubt([s for s in steps if s.step_id not in plan.rerun], run_id, force)
        keys = getattr(graph, "stream_channels_list", None)
        validate_update(update, keys if isinstance(keys, list) else None)
        if update is not None:
            fork_node(plan)
        return plan

    def _rewound(self, run_id: str, plan: Rewind, report: UnwindReport) -> None:
        """The steps undone: rewound (no longer part of the saga), or, when a compensation
        failed or waits, the run stopped as the unwind left it (``SagaAborted``)."""
        if report.needs_attention or report.waiting:
            raise SagaAborted(None, report, reason=f"a retry from {plan.step.node!r} (its "
                                                   "compensations did not all succeed)")
        journal = self.core.journal
        for step in journal.steps(run_id):
            if step.step_id in plan.rerun and step.status != StepStatus.REWOUND:
                journal.step_finish(run_id, step.step_id, StepStatus.REWOUND,
                                    update=step.update, state_after=step.state_after,
                                    error=step.error)
        self.core.set_status(run_id, RunStatus.RUNNING)

    def _retry_from(self, graph: Graph, config: RunnableConfig, target: dict[str, str],
                    update: Mapping[str, Any] | None, by: str, force: bool) -> Any:
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            snapshot = graph.get_state(config)
            plan = self._rewind(graph, config, run_id, snapshot,
                                list(graph.get_state_history(config)), target, update, force)
            # Compensating from here: a crash before the run goes on leaves it to recovery,
            # which unwinds it (never a retry that would run the step again un-undone).
            self.core.set_status(run_id, RunStatus.COMPENSATING)
            if update is None:
                graph.update_state(plan.checkpoint, None, as_node="__copy__")
            else:
                graph.update_state(plan.checkpoint, dict(update), as_node=fork_node(plan))
            before = snapshot.config
            report = self.core.unwind(run_id, Cause("operator", plan.step.node),
                                      triggered_by=by, include_in_doubt=True,
                                      fallback_state=lambda: values_of(graph, before),
                                      within=plan.rerun)
            self._rewound(run_id, plan, report)
            return self._run(graph, None, config, {})

    async def _aretry_from(self, graph: Graph, config: RunnableConfig, target: dict[str, str],
                           update: Mapping[str, Any] | None, by: str, force: bool) -> Any:
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            snapshot = await graph.aget_state(config)
            history = [s async for s in graph.aget_state_history(config)]
            plan = self._rewind(graph, config, run_id, snapshot, history, target, update,
                                force)
            self.core.set_status(run_id, RunStatus.COMPENSATING)
            if update is None:
                await graph.aupdate_state(plan.checkpoint, None, as_node="__copy__")
            else:
                await graph.aupdate_state(plan.checkpoint, dict(update),
                                          as_node=fork_node(plan))
            report = await self.core.aunwind(run_id, Cause("operator", plan.step.node),
                                             triggered_by=by, include_in_doubt=True,
                                             fallback_state=state_values(snapshot.values),
                                             within=plan.rerun)
            self._rewound(run_id, plan, report)
            return await self._arun(graph, None, config, {})

    @staticmethod
    def _refuse_doubt(steps: list[StepRecord], run_id: str, force: bool) -> None:
        doubtful = [s.node for s in steps if s.status == StepStatus.STARTED]
        if doubtful and not force:
            raise InvalidRunState(f"run {run_id!r} has steps in doubt {doubtful}: resuming "
                                  "would run them again; compensate, or retry(force=True)")

    # -- compensation -------------------------------------------------------------------------
    def compensate(self, graph: Graph, config: RunnableConfig, *, by: str = "operator",
                   reason: str = "operator") -> UnwindReport:
        """Unwind the run now (an operator's "compensate"). Compensations that already
        succeeded are skipped, so on a run that needs attention it retries the failed ones.
        Steps left in doubt by a dead process are compensated only when their compensation is
        declared ``in_doubt_safe``."""
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.COMPENSATE, self._run_record(run_id).status, run=run_id,
                  pivot=self._pivot(run_id))
            return self._compensate(graph, config, run_id, by, reason)

    async def acompensate(self, graph: Graph, config: RunnableConfig, *, by: str = "operator",
                          reason: str = "operator") -> UnwindReport:
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.COMPENSATE, self._run_record(run_id).status, run=run_id,
                  pivot=self._pivot(run_id))
            snapshot = await graph.aget_state(config)
            self._reconcile(graph, snapshot, run_id)
            cause = Cause(reason)
            report = await self.core.aunwind(run_id, cause, triggered_by=by,
                                             include_in_doubt=True,
                                             fallback_state=state_values(snapshot.values))
            await aanswer_tool_calls(graph, config, cause, report)
            return report

    def _pivot(self, run_id: str) -> Pivot | None:
        """Where the run's turn stands to its pivot: past it, an operator may not unwind it
        (half a saga), and may retry it forward (``stateguard.lifecycle``)."""
        journal = self.core.journal
        steps = turn_steps(journal, run_id)
        if not any(s.kind == StepKind.PIVOT for s in steps):
            return None
        return pivot_state(steps, unwound=undone(steps, journal.compensations(run_id)))

    def _compensate(self, graph: Graph, config: RunnableConfig, run_id: str, by: str,
                    reason: str | Cause, *, reconcile: bool = True) -> UnwindReport:
        # We hold the lease, so a step still "started" has lost its worker: it is in doubt.
        if reconcile:
            self._reconcile(graph, graph.get_state(config), run_id)
        cause = reason if isinstance(reason, Cause) else Cause(reason)
        report = self.core.unwind(run_id, cause, triggered_by=by, include_in_doubt=True,
                                  fallback_state=lambda: values_of(graph, config))
        answer_tool_calls(graph, config, cause, report)
        return report

    def retry_compensation(self, graph: Graph, config: RunnableConfig, step_id: str, *,
                           by: str = "operator") -> UnwindReport:
        """Run one compensation that failed (or was skipped for a step in doubt) again: fresh
        attempts, the same idempotency key. The others are left as they are, and the run ends
        ``compensated`` only if none is left failed."""
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            self._retryable(run_id, step_id)
            return self.core.unwind(run_id, Cause("operator"), triggered_by=by,
                                    include_in_doubt=True, only=step_id,
                                    fallback_state=lambda: values_of(graph, config))

    async def aretry_compensation(self, graph: Graph, config: RunnableConfig, step_id: str, *,
                                  by: str = "operator") -> UnwindReport:
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            self._retryable(run_id, step_id)
            state = state_values((await graph.aget_state(config)).values)
            return await self.core.aunwind(run_id, Cause("operator"), triggered_by=by,
                                           include_in_doubt=True, only=step_id,
                                           fallback_state=state)

    def _retryable(self, run_id: str, step_id: str) -> None:
        check(Action.RETRY_COMPENSATION, self._run_record(run_id).status, run=run_id)
        record = next((c for c in self.core.journal.compensations(run_id)
                       if c.step_id == step_id), None)
        if record is None or record.status not in RETRYABLE_COMPENSATIONS:
            status = record.status if record else "not there"
            raise InvalidRunState(f"the compensation of step {step_id!r} is {status}; only "
                                  "a failed, skipped-in-doubt or waiting compensation is "
                                  "retried")

    def resolve(self, graph: Graph, config: RunnableConfig, *, note: str,
                by: str = "operator") -> None:
        """Settle a run that needs attention by hand: someone undid what its compensations
        could not (a refund made in the provider's dashboard, say), and ``note`` says what.
        The run ends ``compensated`` (its failed compensations stay journaled as they are),
        and the thread's next invoke starts a new turn."""
        if not isinstance(note, str) or not note.strip():
            raise ConfigurationError("resolve() needs a note saying what was done by hand")
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            check(Action.RESOLVE, self._run_record(run_id).status, run=run_id)
            self.core.journal.run_set_status(run_id, RunStatus.COMPENSATED)
            emit(self.core.on_event, Event("run.status", run_id, data={
                "status": str(RunStatus.COMPENSATED), "resolved_by": by, "note": note}))

    async def aresolve(self, graph: Graph, config: RunnableConfig, *, note: str,
                       by: str = "operator") -> None:
        # Journal calls only: nothing here waits on the graph's saver.
        self.resolve(graph, config, note=note, by=by)

    # -- terminate (stateguard.stops) ---------------------------------------------------------
    def terminate(self, graph: Graph, config: RunnableConfig, *, then: Then = "unwind",
                  by: str | None = None, reason: str = "", request_id: str | None = None
                  ) -> UnwindReport | None:
        """Stop the run now, then unwind it (its compensations, newest first, ``ctx.reason ==
        "terminated"``) or hold it ``needs_attention`` with ``reason`` (``then="hold"``).

        A run a thread of this process is running stops at its next step boundary (an async
        one at once, its step in doubt): its ``invoke`` raises ``SagaAborted`` with
        ``RunTerminated`` as the cause, and this returns ``None``. Otherwise this takes the
        run's lease (``RunLocked`` if another process holds it: ask through its journal,
        ``StopJournal``, instead) and carries it out: a pending run never starts (nothing to
        undo: it ends compensated, or held); a running run whose process died, or that was
        cancelled, is unwound or held as recovery would. Refused (``InvalidRunState``) for a
        run in any other status, and, to unwind, for one past its pivot (half a saga: hold
        it instead). ``request_id`` names the request for a journal that keeps it."""
        stop = StopRequest(then, by, reason, **({"id": request_id} if request_id else {}))
        with self._terminating(graph, config, stop) as run_id:
            if not isinstance(run_id, str):
                return run_id  # asked of this process's thread, or a pending run settled
            self._reconcile(graph, graph.get_state(config), run_id)
            return self.terminated(graph, config, RunTerminated(run_id, stop))

    async def aterminate(self, graph: Graph, config: RunnableConfig, *, then: Then = "unwind",
                         by: str | None = None, reason: str = "",
                         request_id: str | None = None) -> UnwindReport | None:
        stop = StopRequest(then, by, reason, **({"id": request_id} if request_id else {}))
        with self._terminating(graph, config, stop) as run_id:
            if not isinstance(run_id, str):
                return run_id
            self._reconcile(graph, await graph.aget_state(config), run_id)
            return await self.aterminated(graph, config, RunTerminated(run_id, stop))

    @contextmanager
    def _terminating(self, graph: Graph, config: RunnableConfig, stop: StopRequest
                     ) -> Iterator[str | UnwindReport | None]:
        """What ``terminate`` does but for a running run: ``None`` when a thread of this
        process runs the run (asked to stop); else, under the run's lease, the rule, and the
        report of a pending run settled, or the run's id (a running run: the caller stops it,
        the lease held)."""
        run_id = self._known_run(graph, config)
        if self.core.ask_stop(run_id, stop):
            yield None
            return
        with self.core.lease(run_id):
            status = self._run_record(run_id).status
            check(Action.TERMINATE, status, run=run_id,
                  pivot=self._pivot(run_id) if stop.then == "unwind" else None)
            yield self._terminate_pending(run_id, stop) if status == RunStatus.PENDING else run_id

    def _terminate_pending(self, run_id: str, stop: StopRequest) -> UnwindReport:
        """A run that never started: nothing ran, so nothing is undone."""
        if stop.then == "hold":
            report = self.core.hold(run_id, self.core.cause_of(RunTerminated(run_id, stop)),
                                    stop.describe())
        else:
            self.core.set_status(run_id, RunStatus.COMPENSATED, stop.error())
            report = UnwindReport(run_id, "terminated")
        self.core.stopped(run_id, stop)
        return report

    # -- crash recovery -----------------------------------------------------------------------
    def _reconcile(self, graph: Graph, snapshot: Any, run_id: str) -> list[StepRecord]:
        """Make the journal's steps agree with the last checkpoint (``snapshot``), and return
        them.

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
        late_rows = getattr(journal, "defers_steps", False)
        changed = False
        for task in snapshot.tasks:
            step = by_id.get(task.id)
            if _ran(task):
                if step is not None and step.status == StepStatus.STARTED:
                    journal.step_finish(run_id, task.id, StepStatus.SUCCEEDED,
                                        update=task.result)
                    changed = True
                continue
            if step is not None or not late_rows or task.error is not None or task.interrupts:
                continue
            node = graph.nodes.get(task.name)
            journal.step_start(run_id, task.id, task.name,
                               node_tags(node.metadata) if node is not None else ())
            changed = True
        return journal.steps(run_id) if changed else steps

    def recover(self, graph: Graph, config: RunnableConfig, *, resume: bool = False) -> Any:
        """Take over a run whose process died (its lease expired), or that was cancelled or
        stopped before its turn ended: unwind it, or resume it (``resume=True`` re-runs the step
        in doubt: only for idempotent nodes).

        A run whose graph had finished when its process died (it died before saying so, maybe
        before LangGraph's last checkpoint) is settled as it would have been: its final state is
        checked, and it succeeds or unwinds on a violation. Unwinding it for the crash would
        undo a saga that completed.

        A run whose turn passed its pivot (``stateguard.kinds``) is resumed, whatever
        ``resume`` says: it only goes forward. One that died inside its pivot is held
        ``needs_attention``: whether the pivot happened is unknown, so neither is safe.

        A compensating run whose compensations wait (``RetryLater``) is what recovery runs
        the next round of, once their ``retry_at`` has come: the unwind goes on (``ctx.reason``
        ``"retry"``, ``ctx.error`` the run's error), skipping what was undone already."""
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            return self._recover_held(graph, config, self._run_record(run_id), resume=resume)

    def _recover_held(self, graph: Graph, config: RunnableConfig, run: RunRecord, *,
                      resume: bool) -> Any:
        """``recover``, the run's lease held (``run``: the run as read under it)."""
        run_id = run.run_id
        check(Action.RECOVER, run.status, run=run_id)
        # Against the checkpoint the dead process left: _finished may write the next one,
        # whose new tasks never started.
        self._reconcile(graph, graph.get_state(config), run_id)
        stop = self._stop_asked(run)
        if stop is not None:  # an operator asked it to stop before its process died
            return self.terminated(graph, config, RunTerminated(run_id, stop))
        passed, in_pivot = pivot_of(turn_steps(self.core.journal, run_id))
        if run.status == RunStatus.RUNNING and in_pivot is not None and passed is None:
            # Died inside its pivot: neither unwinding nor running it again is safe.
            return self.core.held_past_pivot(run_id, Cause("crash", in_pivot.node))
        # Past its pivot a run only goes forward: resumed, the step in doubt run again.
        resume = resume or passed is not None
        if run.status == RunStatus.RUNNING and (resume or self._finished(graph, config)):
            self.core.set_status(run_id, RunStatus.RUNNING)
            return self._run(graph, None, config, {})
        if run.status == RunStatus.RUNNING and self._pausing(graph, config, run_id):
            # It died after pausing at a gate, before saying so: it waits for a decision.
            self.core.set_status(run_id, RunStatus.PAUSED)
            return None
        by, cause = self._unwind_of(run)
        report = self._compensate(graph, config, run_id, by, cause, reconcile=False)
        self._unwound_for_stop(run_id, cause)
        return report

    async def arecover(self, graph: Graph, config: RunnableConfig, *, resume: bool = False
                       ) -> Any:
        """``recover`` for a graph run with ``ainvoke`` (an async saver): the same rules."""
        run_id = self._known_run(graph, config)
        with self.core.lease(run_id):
            return await self._arecover_held(graph, config, self._run_record(run_id),
                                             resume=resume)

    async def _arecover_held(self, graph: Graph, config: RunnableConfig, run: RunRecord, *,
                             resume: bool) -> Any:
        run_id = run.run_id
        check(Action.RECOVER, run.status, run=run_id)
        self._reconcile(graph, await graph.aget_state(config), run_id)
        stop = self._stop_asked(run)
        if stop is not None:
            return await self.aterminated(graph, config, RunTerminated(run_id, stop))
        passed, in_pivot = pivot_of(turn_steps(self.core.journal, run_id))
        if run.status == RunStatus.RUNNING and in_pivot is not None and passed is None:
            return self.core.held_past_pivot(run_id, Cause("crash", in_pivot.node))
        resume = resume or passed is not None
        if run.status == RunStatus.RUNNING and (resume or await self._afinished(graph,
                                                                                config)):
            self.core.set_status(run_id, RunStatus.RUNNING)
            return await self._arun(graph, None, config, {})
        snapshot = await graph.aget_state(config)
        if run.status == RunStatus.RUNNING and self._pausing_at(snapshot, run_id):
            self.core.set_status(run_id, RunStatus.PAUSED)
            return None
        by, cause = self._unwind_of(run)
        report = await self.core.aunwind(run_id, cause, triggered_by=by, include_in_doubt=True,
                                         fallback_state=state_values(snapshot.values))
        await aanswer_tool_calls(graph, config, cause, report)
        self._unwound_for_stop(run_id, cause)
        return report

    def _stop_asked(self, run: RunRecord) -> StopRequest | None:
        """The stop an operator asked of a running run (``stateguard.stops``), which recovery
        carries out instead of its own policy: unwound, or held, as they chose (even with
        ``resume``: they asked it to stop). A compensating run whose process died while it
        unwound it is unwound on (``_unwind_of``): that was the stop's unwind."""
        if run.status != RunStatus.RUNNING:
            return None
        return self.core.stops.get(run.run_id)

    def _unwind_of(self, run: RunRecord) -> tuple[str, Cause]:
        """Who unwinds a recovered run, and why: the next round of compensations that wait
        (``RetryLater``), else an operator's stop whose unwind a crash cut short, else the
        crash."""
        waiting = any(c.status == CompensationStatus.WAITING
                      for c in self.core.journal.compensations(run.run_id))
        if waiting:
            return "retry", Cause("retry", error=run.error)
        stop = self.core.stops.get(run.run_id)
        if stop is not None:
            return stop.by or "operator", self.core.cause_of(RunTerminated(run.run_id, stop))
        return "recovery", Cause("crash")

    def _unwound_for_stop(self, run_id: str, cause: Cause) -> None:
        stop = self.core.stops.get(run_id)
        if stop is not None and isinstance(cause.exception, RunTerminated):
            self.core.stopped(run_id, stop)

    def _pausing(self, graph: Graph, config: RunnableConfig, run_id: str) -> bool:
        return self._pausing_at(graph.get_state(config), run_id)

    def _pausing_at(self, snapshot: Any, run_id: str) -> bool:
        """Whether the last checkpoint (``snapshot``) waits on approval gates whose approvals
        are still pending, every other task of it having run: the run had paused for an
        operator. (A gate whose approval was given since is not waiting: its body may have
        started.)"""
        pending = {task_of(a.step_id) for a in self.core.journal.approvals(run_id)
                   if a.status == ApprovalStatus.PENDING}
        gates = [t for t in snapshot.tasks if t.interrupts]
        return bool(gates) and all(t.id in pending for t in gates) and all(
            t.interrupts or _ran(t) for t in snapshot.tasks)

    def _finished(self, graph: Graph, config: RunnableConfig) -> bool:
        """Whether the thread's graph has nothing left to run.

        The last checkpoint may list tasks whose writes were saved (the process died before the
        checkpoint that applies them). Those tasks ran; whether the graph goes on after them
        depends on what they wrote, so their writes are applied (stopping before any node) and
        the checkpoint that results is asked."""
        known = _finished_at(graph.get_state(config))
        if known is not None:
            return known
        graph.invoke(None, runner_config(config), durability="sync", interrupt_before="*")
        after = graph.get_state(config)
        return not after.next and not after.tasks

    async def _afinished(self, graph: Graph, config: RunnableConfig) -> bool:
        known = _finished_at(await graph.aget_state(config))
        if known is not None:
            return known
        await graph.ainvoke(None, runner_config(config), durability="sync",
                            interrupt_before="*")
        after = await graph.aget_state(config)
        return not after.next and not after.tasks


def _finished_at(snapshot: Any) -> bool | None:
    """Whether the graph of the last checkpoint (``snapshot``) has nothing left to run, or
    None when that depends on the saved writes of tasks that ran (``_finished``)."""
    if snapshot.created_at is None or snapshot.next:
        return False
    if not snapshot.tasks:
        return True
    if not all(_ran(task) for task in snapshot.tasks):
        return False
    return None
