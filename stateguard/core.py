"""``GuardCore``: what the LangGraph guard and ``GuardedState`` share: the validated spec, the
journal, the event callback, leases, and the unwind."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from stateguard.context import InvariantInfo
from stateguard.events import Event, EventCallback, emit
from stateguard.exceptions import (
    ApprovalRejected,
    ConfigurationError,
    InvariantViolation,
    RunLocked,
    RunTerminated,
)
from stateguard.faults import FaultHook
from stateguard.history import Histories
from stateguard.journal import InMemoryJournal, Journal, StopJournal, turn_steps
from stateguard.kinds import build_kinds, check_step_retry, held_reason
from stateguard.records import ApprovalStatus, ErrorInfo, RunStatus
from stateguard.report import UnwindReport
from stateguard.retry import CompensationRetry
from stateguard.spec import (
    GuardSpec,
    build_approvals,
    build_compensations,
    build_invariants,
)
from stateguard.stops import StopRequest, Stops
from stateguard.tool_policy import build_tool_error_policy
from stateguard.unwind import Cause, aunwind, unwind

logger = logging.getLogger("stateguard")


class GuardCore:
    def __init__(self, *, invariants: Iterable[Any] = (),
                 compensations: Mapping[str, Any] | None = None,
                 approvals: Iterable[str] | Mapping[str, Any] | None = None,
                 compensation_retry: CompensationRetry | None = None,
                 journal: Journal | None = None, on_event: EventCallback | None = None,
                 lease_ttl: float = 60.0, lease_heartbeat: float | None = None,
                 on_tool_error: Any = "auto", kinds: Mapping[str, Any] | None = None,
                 step_retry: CompensationRetry | None = None,
                 fault_hook: FaultHook | None = None) -> None:
        if compensation_retry is not None and not isinstance(compensation_retry,
                                                             CompensationRetry):
            raise ConfigurationError("compensation_retry must be a CompensationRetry")
        if journal is not None and not isinstance(journal, Journal):
            raise ConfigurationError(f"{journal!r} does not implement the Journal protocol")
        if on_event is not None and not callable(on_event):
            raise ConfigurationError("on_event must be callable")
        if fault_hook is not None and not callable(fault_hook):
            raise ConfigurationError("fault_hook must be callable (stateguard.faults)")
        if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
            raise ConfigurationError("lease_ttl must be a positive number of seconds")
        if lease_heartbeat is None:
            lease_heartbeat = lease_ttl / 3
        if not isinstance(lease_heartbeat, (int, float)) or not 0 < lease_heartbeat < lease_ttl:
            raise ConfigurationError("lease_heartbeat must be positive and below lease_ttl")
        check_step_retry(step_retry, "step_retry")
        step_kinds, step_retries = build_kinds(kinds)
        self.spec = GuardSpec(build_invariants(invariants), build_compensations(compensations),
                              build_approvals(approvals), compensation_retry or CompensationRetry(),
                              build_tool_error_policy(on_tool_error), kinds=step_kinds,
                              step_retries=step_retries,
                              step_retry=step_retry or CompensationRetry())
        self.journal: Journal = journal if journal is not None else InMemoryJournal(
            undoable=lambda step: self.spec.compensation_for(step.node, step.tags) is not None)
        # What the guard's code calls: None when no one listens (the hot path then builds no
        # event), else the user's callback, or ``_dispatch`` while a stream listens too.
        self.on_event: EventCallback | None = on_event
        self._user_on_event = on_event
        self.fault_hook = fault_hook  # fault injection in tests (stateguard.faults)
        self._listeners: dict[str, list[queue.SimpleQueue[Event]]] = {}
        self._listening = threading.Lock()
        self.lease_ttl = float(lease_ttl)
        self.lease_heartbeat = float(lease_heartbeat)
        # run id -> (owner, last renewal on the monotonic clock, and on the wall clock)
        self._held: dict[str, tuple[str, float, float]] = {}
        self._lost: set[str] = set()  # runs whose lease the heartbeat found taken over
        # One heartbeat thread per guard renews every lease this process holds; the lock keeps
        # it from renewing a lease that is being released (that would re-take the run).
        self._renewing = threading.Lock()
        self._beat: threading.Thread | None = None
        # The message histories journaled for the runs this process holds (stateguard.history).
        self.histories = Histories()
        # Operators' requests to stop the runs this process holds (stateguard.stops).
        self.stops = Stops()

    # -- leases ------------------------------------------------------------------------------
    @contextmanager
    def listening(self, run_id: str) -> Iterator[queue.SimpleQueue[Event]]:
        """The run's events, besides the ``on_event`` callback's, in a queue of their own while
        the block runs (``guard.stream``): from any thread the run's steps run on."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        with self._listening:
            self._listeners.setdefault(run_id, []).append(events)
            self.on_event = self._dispatch
        try:
            yield events
        finally:
            with self._listening:
                self._listeners[run_id].remove(events)
                if not self._listeners[run_id]:
                    del self._listeners[run_id]
                self.on_event = self._dispatch if self._listeners else self._user_on_event

    def _dispatch(self, event: Event) -> None:
        emit(self._user_on_event, event)
        for events in self._listeners.get(event.run_id, ()):
            events.put(event)

    @contextmanager
    def lease(self, run_id: str) -> Iterator[str]:
        """Hold the run's lock while the body runs; ``RunLocked`` if another owner has it.

        Without it, two processes resuming one run both execute the next node (measured: a
        double charge). The lease is renewed in the background while the body runs."""
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        if not self.journal.lock_acquire(run_id, owner, self.lease_ttl):
            held = self.journal.run_get(run_id)
            raise RunLocked(run_id, held.lock_owner if held else None)
        self.histories.hold(run_id)
        with self._renewing:
            self._held[run_id] = (owner, time.monotonic(), time.time())
            self._lost.discard(run_id)
            if self._beat is None or not self._beat.is_alive():
                self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                              name="stateguard-lease-heartbeat")
                self._beat.start()
        try:
            self.poll_stop(run_id)  # asked while no one held it, or while its process died
            yield owner
        finally:
            self.histories.release(run_id)
            with self._renewing:
                self._held.pop(run_id, None)
                self._lost.discard(run_id)  # nothing to remember once we let go
                self.stops.forget(run_id)  # the journal still has it, if not carried out
                self.journal.lock_release(run_id, owner)

    def _heartbeat(self) -> None:
        """Keep every held lease alive while long nodes or compensations run."""
        try:
            while True:
                time.sleep(self.lease_heartbeat)
                for run_id, (owner, renewed, _) in list(self._held.items()):
                    if time.monotonic() - renewed < self.lease_heartbeat / 2:
                        continue  # renewed just now (check_lease renews a stale lease)
                    try:
                        self._renew(run_id, owner)
                    except Exception:  # the journal is down: try again next beat
                        logger.exception("renewing the lease of run %s failed", run_id)
                for run_id in list(self._held):
                    try:
                        self.poll_stop(run_id)
                    except Exception:
                        logger.exception("asking whether run %s is to stop failed", run_id)
        except BaseException:
            logger.exception("the lease heartbeat stopped; the next lease restarts it")
            raise

    def _renew(self, run_id: str, owner: str) -> None:
        with self._renewing:
            if self._held.get(run_id, ("",))[0] != owner:
                return  # released meanwhile
            if self.journal.lock_renew(run_id, owner, self.lease_ttl):
                self._held[run_id] = (owner, time.monotonic(), time.time())
            else:
                self._lost.add(run_id)

    def check_lease(self, run_id: str) -> None:
        """Raise ``RunLocked`` if this process's lease was taken over, before a node body or a
        compensation attempt.

        The heartbeat finds out in the background. If it has not renewed for half a lease (the
        process stalled: a long pause, a frozen VM, the journal unreachable), the lease may
        have run out and been taken meanwhile: renew it now, and act only if that works."""
        held = self._held.get(run_id)
        if held is not None and run_id not in self._lost and (
                max(time.monotonic() - held[1], time.time() - held[2]) > self.lease_ttl / 2):
            try:
                self._renew(run_id, held[0])
            except Exception as exc:  # cannot tell whether the lease still holds: do not act
                raise RunLocked(run_id) from exc
        if run_id in self._lost:
            raise RunLocked(run_id)

    # -- stops (stateguard.stops) ------------------------------------------------------------
    def poll_stop(self, run_id: str) -> None:
        """Ask the journal whether an operator asked the run to stop (``StopJournal``)."""
        if run_id in self._held and self.stops.get(run_id) is None and isinstance(
                self.journal, StopJournal):
            stop = self.journal.run_stop_requested(run_id)
            if stop is not None:
                logger.info("run %s is to stop: %s", run_id, stop.describe())
                self.stops.ask(run_id, stop)

    def ask_stop(self, run_id: str, stop: StopRequest) -> bool:
        """Ask the run to stop at its next step boundary, if this process holds it (a thread
        of it runs the run); ``False`` if it does not."""
        with self._renewing:  # the lease is not let go of meanwhile
            if run_id not in self._held:
                return False
            self.stops.ask(run_id, stop)
            return True

    def check_stop(self, run_id: str, node: str | None = None) -> None:
        """At a step boundary (before ``node``): raise ``RunTerminated`` if the run was asked
        to stop."""
        stop = self.stops.get(run_id)
        if stop is not None:
            raise RunTerminated(run_id, stop, node=node)

    def stopped(self, run_id: str, stop: StopRequest) -> None:
        """``stop`` was carried out: tell the journal (the run's status as it is now), then
        forget it (in that order: the heartbeat would find it in the journal again)."""
        run = self.journal.run_get(run_id)
        status = run.status if run is not None else RunStatus.NEEDS_ATTENTION
        if isinstance(self.journal, StopJournal):
            self.journal.run_stop_done(run_id, stop, status)
        self.stops.forget(run_id)
        emit(self.on_event, Event("run.terminated", run_id, data={
            "then": stop.then, "by": stop.by, "reason": stop.reason, "status": str(status)}))

    def hold(self, run_id: str, cause: Cause, why: str) -> UnwindReport:
        """Hold the run ``needs_attention`` with ``cause``'s error: nothing is undone."""
        self.journal.run_set_status(run_id, RunStatus.NEEDS_ATTENTION, cause.error)
        emit(self.on_event, Event("run.status", run_id, data={
            "status": str(RunStatus.NEEDS_ATTENTION), "reason": why}))
        return UnwindReport(run_id, cause.reason, held=why)

    # -- run status -------------------------------------------------------------------------
    def set_status(self, run_id: str, status: RunStatus, error: ErrorInfo | None = None) -> None:
        self.journal.run_set_status(run_id, status, error)
        emit(self.on_event, Event("run.status", run_id, data={"status": str(status)}))

    # -- unwind -----------------------------------------------------------------------------
    def cause_of(self, exc: BaseException | None, *, failed_node: str | None = None,
                 reason: str | None = None) -> Cause:
        if isinstance(exc, InvariantViolation):
            return Cause(reason or "invariant", exc.node or failed_node,
                         ErrorInfo.from_exception(exc), InvariantInfo(exc.invariant, exc.message),
                         exc)
        if isinstance(exc, ApprovalRejected):
            return Cause(reason or "rejected", exc.node, ErrorInfo.from_exception(exc),
                         exception=exc)
        if exc is None:
            return Cause(reason or "operator", failed_node)
        if isinstance(exc, RunTerminated):
            return Cause(reason or "terminated", exc.node or failed_node, exc.stop.error(),
                         exception=exc)
        node = getattr(exc, "stateguard_node", None) or failed_node
        return Cause(reason or "error", node, ErrorInfo.from_exception(exc), exception=exc)

    def close_approvals(self, run_id: str, by: str | None, reason: str) -> None:
        """Reject every pending approval: once a run unwinds, no gated step may run later."""
        for approval in self.journal.approvals(run_id):
            if approval.status == ApprovalStatus.PENDING and self.journal.approval_decide(
                    run_id, approval.step_id, ApprovalStatus.REJECTED, by=by, reason=reason):
                emit(self.on_event, Event("approval.decided", run_id, approval.node,
                                          approval.step_id,
                                          {"decision": str(ApprovalStatus.REJECTED), "by": by}))

    def held_past_pivot(self, run_id: str, cause: Cause) -> UnwindReport | None:
        """Hold the run ``needs_attention`` instead of unwinding it when its turn passed its
        pivot (``stateguard.kinds``): undoing the steps before the point of no return would
        undo half a saga. The run's error says why; ``None`` if it may be unwound."""
        why = held_reason(turn_steps(self.journal, run_id))
        if why is None:
            return None
        error = cause.error or ErrorInfo("NotUnwound", cause.reason)
        self.journal.run_set_status(run_id, RunStatus.NEEDS_ATTENTION, ErrorInfo(
            error.type, f"{error.message}; not unwound: {why}", error.traceback))
        emit(self.on_event, Event("run.status", run_id, data={
            "status": str(RunStatus.NEEDS_ATTENTION), "reason": why}))
        return UnwindReport(run_id, cause.reason, held=why)

    def unwind(self, run_id: str, cause: Cause, *, include_in_doubt: bool = False,
               triggered_by: str = "automatic", fallback_state: Any = None,
               only: str | None = None, within: frozenset[str] | None = None
               ) -> UnwindReport:
        """Undo the run (see ``stateguard.unwind``). ``within``: a retry from an earlier step
        undoes those steps only; it checked that no pivot lies among them, so a pivot passed
        before them does not hold the run."""
        self.close_approvals(run_id, triggered_by, f"run unwound ({cause.reason})")
        held = self.held_past_pivot(run_id, cause) if within is None else None
        if held is not None:
            return held
        return unwind(self.journal, run_id, self.spec, cause, include_in_doubt=include_in_doubt,
                      triggered_by=triggered_by, fallback_state=fallback_state,
                      on_event=self.on_event, check=lambda: self.check_lease(run_id), only=only,
                      within=within)

    async def aunwind(self, run_id: str, cause: Cause, *, include_in_doubt: bool = False,
                      triggered_by: str = "automatic", fallback_state: Any = None,
                      only: str | None = None, within: frozenset[str] | None = None
                      ) -> UnwindReport:
        self.close_approvals(run_id, triggered_by, f"run unwound ({cause.reason})")
        held = self.held_past_pivot(run_id, cause) if within is None else None
        if held is not None:
            return held
        return await aunwind(self.journal, run_id, self.spec, cause,
                             include_in_doubt=include_in_doubt, triggered_by=triggered_by,
                             fallback_state=fallback_state, on_event=self.on_event,
                             check=lambda: self.check_lease(run_id), only=only,
                             within=within)
