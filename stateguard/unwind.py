"""The unwind: run the compensations of every step that had its effect, newest first.

Each attempt is journaled before the next one starts, and a compensation that already succeeded
is skipped, so running an unwind again (after a crash, or by an operator) is safe. A compensation
that fails on every attempt does not stop the others: the customer still gets every refund that
*can* be made, and the run ends ``needs_attention`` with every attempt's error in the report.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from stateguard.context import ExceptionContext, InvariantInfo, idempotency_key
from stateguard.events import Event, EventCallback, EventType, emit
from stateguard.journal import Journal
from stateguard.records import (
    DONE_COMPENSATIONS,
    EFFECT_STATUSES,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    ErrorInfo,
    RunStatus,
    StepRecord,
    StepStatus,
)
from stateguard.report import CompensationOutcome, UnwindReport
from stateguard.spec import Compensation, GuardSpec


@dataclass(frozen=True, slots=True)
class Cause:
    """Why the run is being unwound; becomes part of every ``ExceptionContext``."""

    reason: str  # "error", "invariant", "rejected", "operator", "crash"
    failed_node: str | None = None
    error: ErrorInfo | None = None
    invariant: InvariantInfo | None = None


@dataclass(frozen=True, slots=True)
class _Planned:
    step: StepRecord
    compensation: Compensation | None
    in_doubt: bool


def plan(journal: Journal, run_id: str, spec: GuardSpec, *, include_in_doubt: bool
         ) -> list[_Planned]:
    """Steps to undo, newest first: in-doubt steps (started last), then by completion order."""
    steps = journal.steps(run_id)
    done = sorted((s for s in steps if s.status in EFFECT_STATUSES),
                  key=lambda s: s.done_seq or 0, reverse=True)
    doubtful = sorted((s for s in steps if s.status == StepStatus.STARTED and include_in_doubt),
                      key=lambda s: s.started_at, reverse=True)
    return ([_Planned(s, spec.compensation_for(s.node, s.tags), True) for s in doubtful]
            + [_Planned(s, spec.compensation_for(s.node, s.tags), False) for s in done])


class _Unwinder:
    """State shared by the sync and async twins; only the call and the sleep differ."""

    def __init__(self, journal: Journal, run_id: str, spec: GuardSpec, cause: Cause, *,
                 triggered_by: str, fallback_state: Any, on_event: EventCallback | None) -> None:
        self.journal, self.run_id, self.spec, self.cause = journal, run_id, spec, cause
        self.triggered_by, self.fallback_state, self.on_event = (
            triggered_by, fallback_state, on_event)
        self.outcomes: list[CompensationOutcome] = []

    def begin(self, item: _Planned) -> tuple[CompensationRecord, int] | None:
        """Journal the compensation row; ``None`` when there is nothing to run for this step."""
        step, comp = item.step, item.compensation
        if comp is None:
            self.outcomes.append(CompensationOutcome(step.node, step.step_id, "no_compensation"))
            return None
        record = self.journal.compensation_begin(CompensationRecord(
            self.run_id, step.step_id, step.node, idempotency_key(self.run_id, step.step_id),
            triggered_by=self.triggered_by))
        if record.status in DONE_COMPENSATIONS:
            self.outcomes.append(CompensationOutcome(step.node, step.step_id, "already_done",
                                                     len(record.attempts)))
            return None
        if item.in_doubt and not comp.in_doubt_safe:
            now = time.time()
            error = ErrorInfo("InDoubt", f"step {step.node!r} was in progress when the process "
                              "died and its compensation is not declared in_doubt_safe")
            self.journal.compensation_attempt(
                self.run_id, step.step_id,
                AttemptRecord(len(record.attempts) + 1, now, now, False, error=error),
                CompensationStatus.SKIPPED_IN_DOUBT)
            self._finish(step, CompensationStatus.SKIPPED_IN_DOUBT, 1, [error])
            return None
        return record, len(record.attempts)

    def context(self, item: _Planned, record: CompensationRecord, attempt: int
                ) -> ExceptionContext:
        return ExceptionContext(
            run_id=self.run_id, node=item.step.node, step_id=item.step.step_id,
            step_result=item.step.update, attempt=attempt,
            idempotency_key=record.idempotency_key, reason=self.cause.reason,
            failed_node=self.cause.failed_node, error=self.cause.error,
            invariant=self.cause.invariant, in_doubt=item.in_doubt)

    def state_for(self, step: StepRecord) -> Any:
        if step.state_after is not None:
            return step.state_after
        if callable(self.fallback_state):  # computed only when a step has no state of its own
            self.fallback_state = self.fallback_state()
        return self.fallback_state

    def record(self, item: _Planned, number: int, started: float, result: Any,
               error: BaseException | None, last: bool) -> CompensationStatus:
        step = item.step
        if error is None:
            status = (CompensationStatus.SUCCEEDED if result
                      else CompensationStatus.NOTHING_TO_UNDO)
        else:
            status = CompensationStatus.FAILED if last else CompensationStatus.RUNNING
        info = ErrorInfo.from_exception(error) if error is not None else None
        self.journal.compensation_attempt(
            self.run_id, step.step_id,
            AttemptRecord(number, started, time.time(), error is None,
                          result=repr(result)[:200] if error is None else "", error=info),
            status)
        emit(self.on_event, Event("compensation.attempt", self.run_id, step.node, step.step_id,
                                  {"attempt": number, "ok": error is None,
                                   "error": str(info) if info else None}))
        return status

    def _finish(self, step: StepRecord, status: CompensationStatus, attempts: int,
                errors: list[ErrorInfo]) -> None:
        self.outcomes.append(CompensationOutcome(step.node, step.step_id, status, attempts,
                                                 tuple(errors)))
        kind: EventType = "compensation.failed" if status in (
            CompensationStatus.FAILED, CompensationStatus.SKIPPED_IN_DOUBT
        ) else "compensation.succeeded"
        emit(self.on_event, Event(kind, self.run_id, step.node, step.step_id,
                                  {"status": str(status), "attempts": attempts}))

    def finish_step(self, item: _Planned, status: CompensationStatus, record_id: str) -> None:
        comps = {c.step_id: c for c in self.journal.compensations(self.run_id)}
        attempts = comps[record_id].attempts if record_id in comps else []
        self._finish(item.step, status, len(attempts),
                     [a.error for a in attempts if a.error is not None])

    def report(self) -> UnwindReport:
        result = UnwindReport(self.run_id, self.cause.reason, tuple(self.outcomes))
        status = RunStatus.NEEDS_ATTENTION if result.needs_attention else RunStatus.COMPENSATED
        self.journal.run_set_status(self.run_id, status, self.cause.error)
        emit(self.on_event, Event("run.status", self.run_id, data={"status": str(status)}))
        return result


def _start(journal: Journal, run_id: str, on_event: EventCallback | None) -> None:
    journal.run_set_status(run_id, RunStatus.COMPENSATING)
    emit(on_event, Event("run.status", run_id, data={"status": str(RunStatus.COMPENSATING)}))


def unwind(journal: Journal, run_id: str, spec: GuardSpec, cause: Cause, *,
           include_in_doubt: bool = False, triggered_by: str = "automatic",
           fallback_state: Any = None, on_event: EventCallback | None = None,
           sleep: Callable[[float], None] = time.sleep,
           check: Callable[[], None] = lambda: None) -> UnwindReport:
    """Compensate every step of ``run_id`` that had its effect, newest first (see module doc).

    Each compensation gets the state journaled right after its step; ``fallback_state`` (a
    value, or a zero-argument callable computed on first need) stands in for steps that have
    none, such as a step left in doubt by a dead process. ``check`` runs before every attempt
    and raises to stop (the lease was lost: another process owns the unwind now)."""
    u = _Unwinder(journal, run_id, spec, cause, triggered_by=triggered_by,
                  fallback_state=fallback_state, on_event=on_event)
    _start(journal, run_id, on_event)
    for item in plan(journal, run_id, spec, include_in_doubt=include_in_doubt):
        begun = u.begin(item)
        if begun is None:
            continue
        record, done = begun
        assert item.compensation is not None
        retry = item.compensation.retry or spec.retry
        status = CompensationStatus.RUNNING
        for i in range(retry.attempts):
            number, started = done + i + 1, time.time()
            check()
            try:
                assert item.compensation is not None
                result = item.compensation.fn(u.state_for(item.step),
                                              u.context(item, record, number))
                if inspect.isawaitable(result):
                    result = _run_coroutine(result)
                error: BaseException | None = None
            except Exception as exc:
                result, error = None, exc
            last = i == retry.attempts - 1
            status = u.record(item, number, started, result, error, last)
            if error is None:
                break
            if not last:
                sleep(retry.delay(i + 1))
        u.finish_step(item, status, item.step.step_id)
    return u.report()


async def aunwind(journal: Journal, run_id: str, spec: GuardSpec, cause: Cause, *,
                  include_in_doubt: bool = False, triggered_by: str = "automatic",
                  fallback_state: Any = None, on_event: EventCallback | None = None,
                  check: Callable[[], None] = lambda: None) -> UnwindReport:
    """``unwind`` for asyncio: awaits async compensations, runs sync ones in a thread."""
    u = _Unwinder(journal, run_id, spec, cause, triggered_by=triggered_by,
                  fallback_state=fallback_state, on_event=on_event)
    _start(journal, run_id, on_event)
    for item in plan(journal, run_id, spec, include_in_doubt=include_in_doubt):
        begun = u.begin(item)
        if begun is None:
            continue
        record, done = begun
        comp = item.compensation
        assert comp is not None
        retry = comp.retry or spec.retry
        status = CompensationStatus.RUNNING
        for i in range(retry.attempts):
            number, started = done + i + 1, time.time()
            check()
            ctx = u.context(item, record, number)
            try:
                if inspect.iscoroutinefunction(comp.fn):
                    result = await comp.fn(u.state_for(item.step), ctx)
                else:
                    result = await asyncio.to_thread(comp.fn, u.state_for(item.step), ctx)
                    if inspect.isawaitable(result):
                        result = await result
                error: BaseException | None = None
            except Exception as exc:
                result, error = None, exc
            last = i == retry.attempts - 1
            status = u.record(item, number, started, result, error, last)
            if error is None:
                break
            if not last:
                await asyncio.sleep(retry.delay(i + 1))
        u.finish_step(item, status, item.step.step_id)
    return u.report()


def _run_coroutine(awaitable: Any) -> Any:
    """Run an async compensation from the sync unwind, even when this thread already runs an
    event loop (then in a thread of its own, since a loop cannot be re-entered)."""
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()
