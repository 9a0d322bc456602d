"""The unwind: run the compensations of every step that had its effect, newest first.

Each attempt is journaled before the next one starts, and a compensation that already succeeded
is skipped, so running an unwind again (after a crash, or by an operator) is safe. A compensation
that fails on every attempt does not stop the others: the customer still gets every refund that
*can* be made, and the run ends ``needs_attention`` with every attempt's error in the report.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stateguard.context import ExceptionContext, InvariantInfo, idempotency_key
from stateguard.effects import recording
from stateguard.events import Event, EventCallback, EventType, emit
from stateguard.history import States, is_encoded
from stateguard.journal import Journal, turn_steps
from stateguard.records import (
    DONE_COMPENSATIONS,
    EFFECT_STATUSES,
    STUCK_COMPENSATIONS,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    ErrorInfo,
    RunStatus,
    StepRecord,
    StepStatus,
)
from stateguard.report import CompensationOutcome, UnwindReport
from stateguard.retry import CompensationRetry
from stateguard.spec import Compensation, GuardSpec
from stateguard.subgraphs import SUBGRAPH_TAG
from stateguard.tool_calls import tool_call_of

logger = logging.getLogger("stateguard")


@dataclass(frozen=True, slots=True)
class Cause:
    """Why the run is being unwound; becomes part of every ``ExceptionContext``."""

    reason: str  # "error", "invariant", "rejected", "operator", "crash", "retry"
    failed_node: str | None = None
    error: ErrorInfo | None = None
    invariant: InvariantInfo | None = None
    # The error itself, while the unwind runs in the process that caught it: a compensation
    # that raises then has it as its context, and its traceback is kept once, in ``error``.
    exception: BaseException | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class _Planned:
    step: StepRecord
    compensation: Compensation | None
    in_doubt: bool


def plan(journal: Journal, run_id: str, spec: GuardSpec, *, include_in_doubt: bool
         ) -> list[_Planned]:
    """Steps to undo, newest first: steps whose effect is unknown (started last), then by
    completion order.

    Unknown: a step left "started" by a dead process (with ``include_in_doubt``), and a step
    that failed (or paused itself by ``interrupt()``) but whose compensation is
    ``in_doubt_safe``. A body can raise after its effect happened (the provider charged the
    card, and its answer was lost), or act before it pauses; a compensation that checks before
    it acts costs nothing when there was no effect, and catches that one. A paused step is
    otherwise no effect: an ordinary compensation never runs for it.

    Only the run's current turn is undone: an earlier turn of the thread finished, settled."""
    steps = turn_steps(journal, run_id)
    done = sorted((s for s in steps if s.status in EFFECT_STATUSES),
                  key=lambda s: s.done_seq or 0, reverse=True)

    def unknown(step: StepRecord) -> bool:
        if step.status == StepStatus.STARTED:
            return include_in_doubt
        comp = spec.compensation_for(step.node, step.tags)
        if step.status not in (StepStatus.FAILED, StepStatus.PAUSED) or comp is None:
            return False
        # A subgraph that raised, or paused inside, may have had inner effects first: never
        # "no effect".
        return comp.in_doubt_safe or SUBGRAPH_TAG in step.tags

    doubtful = sorted((s for s in steps if unknown(s)), key=lambda s: s.started_at, reverse=True)
    return ([_Planned(s, spec.compensation_for(s.node, s.tags), True) for s in doubtful]
            + [_Planned(s, spec.compensation_for(s.node, s.tags), False) for s in done])


@dataclass(slots=True)
class _Attempting:
    """One compensation being tried: the attempts of earlier unwinds, then this one's."""

    item: _Planned
    fn: Any
    record: CompensationRecord
    retry: CompensationRetry
    attempts: list[AttemptRecord]
    tries: int = 0
    status: CompensationStatus = CompensationStatus.RUNNING
    retry_at: float | None = None  # waiting: when its next round is due


class _Unwinder:
    """Everything but calling the compensation and waiting between attempts, which the sync
    and async drivers (``unwind``/``aunwind``) do their own way:

        for attempt, ctx, state in unwinder.attempts():
            ...call attempt.fn(state, ctx)...
            delay = unwinder.record(attempt, started, result, error)
    """

    def __init__(self, journal: Journal, run_id: str, spec: GuardSpec, cause: Cause, *,
                 include_in_doubt: bool, triggered_by: str, fallback_state: Any,
                 on_event: EventCallback | None, check: Callable[[], None],
                 only: str | None = None, within: frozenset[str] | None = None) -> None:
        self.journal, self.run_id, self.spec, self.cause = journal, run_id, spec, cause
        self.only, self.within = only, within
        self.include_in_doubt, self.triggered_by = include_in_doubt, triggered_by
        self.fallback_state, self.on_event, self.check = fallback_state, on_event, check
        self.outcomes: list[CompensationOutcome] = []
        self._states: States | None = None  # the run's steps' states, read on first need

    def attempts(self) -> Iterator[tuple[_Attempting, ExceptionContext, Any]]:
        """Each attempt to make, newest step first; ``record`` must follow each one."""
        self.journal.run_set_status(self.run_id, RunStatus.COMPENSATING)
        emit(self.on_event, Event("run.status", self.run_id,
                                  data={"status": str(RunStatus.COMPENSATING)}))
        kept = {c.step_id: c for c in self.journal.compensations(self.run_id)} if self.only else {}
        for item in plan(self.journal, self.run_id, self.spec,
                         include_in_doubt=self.include_in_doubt):
            if self.within is not None and item.step.step_id not in self.within:
                continue  # a retry from a step undoes that step and those after it only
            if self.only is not None and item.step.step_id != self.only:
                self._keep(item, kept.get(item.step.step_id))
                continue
            attempt = self._begin(item)
            if attempt is None:
                continue
            while attempt.status == CompensationStatus.RUNNING:
                self.check()
                state = self._state_for(item.step)
                yield attempt, self._context(attempt, state), state
            self._finish(item.step, attempt.status, attempt.attempts, attempt.retry_at)

    def _keep(self, item: _Planned, record: CompensationRecord | None) -> None:
        """A step an unwind of one compensation leaves alone: its outcome stays what the
        journal says, so that the run's status still counts it."""
        step = item.step
        if item.compensation is None:
            status: CompensationStatus | str = "no_compensation"
        elif record is None:
            status = "not_run"
        elif record.status in DONE_COMPENSATIONS:
            status = "already_done"
        else:
            status = record.status
        self.outcomes.append(CompensationOutcome(
            step.node, step.step_id, status, len(record.attempts) if record else 0,
            tuple(a.error for a in record.attempts if a.error) if record else ()))

    def _begin(self, item: _Planned) -> _Attempting | None:
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
        attempts = list(record.attempts)
        # An operator who retries this one compensation has decided it is safe to run.
        if item.in_doubt and not comp.in_doubt_safe and self.only is None:
            now = time.time()
            error = ErrorInfo("InDoubt", f"step {step.node!r} was in progress when the process "
                              "died and its compensation is not declared in_doubt_safe")
            skipped = AttemptRecord(len(attempts) + 1, now, now, False, error=error)
            self.journal.compensation_attempt(self.run_id, step.step_id, skipped,
                                              CompensationStatus.SKIPPED_IN_DOUBT)
            self._finish(step, CompensationStatus.SKIPPED_IN_DOUBT, [skipped])
            return None
        return _Attempting(item, comp.fn, record, comp.retry or self.spec.retry, attempts)

    def _context(self, attempt: _Attempting, state: Any) -> ExceptionContext:
        step = attempt.item.step
        return ExceptionContext(
            run_id=self.run_id, node=step.node, step_id=step.step_id,
            step_result=step.update, attempt=len(attempt.attempts) + 1,
            idempotency_key=attempt.record.idempotency_key, reason=self.cause.reason,
            failed_node=self.cause.failed_node, error=self.cause.error,
            invariant=self.cause.invariant, in_doubt=attempt.item.in_doubt,
            tool_call=tool_call_of(step, state))

    def _state_for(self, step: StepRecord) -> Any:
        if is_encoded(step.state_after):  # its messages journaled against earlier steps'
            if self._states is None:
                self._states = States(self.journal.steps(self.run_id))
            state = self._states.state(step)
            if state is not None:
                return state
            logger.warning("the state of step %s of run %s cannot be rebuilt (a step it was "
                           "journaled against ran again): its compensation gets the thread's",
                           step.step_id, self.run_id)
        elif step.state_after is not None:
            return step.state_after
        if callable(self.fallback_state):  # computed only when a step has no state of its own
            self.fallback_state = self.fallback_state()
        return self.fallback_state

    def record(self, attempt: _Attempting, started: float, result: Any,
               error: BaseException | None) -> float:
        """Journal the attempt before anything else happens; the seconds to wait before the
        next attempt (0 when this was the last one)."""
        step, now = attempt.item.step, time.time()
        attempt.tries += 1
        if error is None:
            attempt.status = (CompensationStatus.SUCCEEDED if result
                              else CompensationStatus.NOTHING_TO_UNDO)
        elif attempt.retry.is_permanent(error):
            attempt.status = CompensationStatus.FAILED  # no attempt, now or later, would help
        elif attempt.tries >= attempt.retry.attempts:
            later = attempt.retry.later
            first = attempt.attempts[0].started_at if attempt.attempts else started
            attempt.retry_at = later.retry_at(first, now) if later is not None else None
            attempt.status = (CompensationStatus.FAILED if attempt.retry_at is None
                              else CompensationStatus.WAITING)
        info = (ErrorInfo.from_exception(error, known=self.cause.exception)
                if error is not None else None)
        done = AttemptRecord(len(attempt.attempts) + 1, started, now, error is None,
                             result=repr(result)[:200] if error is None else "", error=info)
        if attempt.retry_at is None:
            self.journal.compensation_attempt(self.run_id, step.step_id, done, attempt.status)
        else:  # a keyword journals without durable waits do not take
            self.journal.compensation_attempt(self.run_id, step.step_id, done, attempt.status,
                                              retry_at=attempt.retry_at)
        attempt.attempts.append(done)
        emit(self.on_event, Event("compensation.attempt", self.run_id, step.node, step.step_id,
                                  {"attempt": done.number, "ok": error is None,
                                   "error": str(info) if info else None}))
        if attempt.status != CompensationStatus.RUNNING:
            return 0.0
        return attempt.retry.delay(attempt.tries)

    def _finish(self, step: StepRecord, status: CompensationStatus,
                attempts: list[AttemptRecord], retry_at: float | None = None) -> None:
        errors = tuple(a.error for a in attempts if a.error is not None)
        self.outcomes.append(CompensationOutcome(step.node, step.step_id, status,
                                                 len(attempts), errors, retry_at))
        kind: EventType = (
            "compensation.failed" if status in STUCK_COMPENSATIONS
            else "compensation.waiting" if status == CompensationStatus.WAITING
            else "compensation.succeeded")
        data: dict[str, Any] = {"status": str(status), "attempts": len(attempts)}
        if retry_at is not None:
            data["retry_at"] = retry_at
        emit(self.on_event, Event(kind, self.run_id, step.node, step.step_id, data))

    def report(self) -> UnwindReport:
        """End the unwind: the run needs attention (a compensation failed for good), stays
        compensating (one waits to be tried again), or is compensated."""
        result = UnwindReport(self.run_id, self.cause.reason, tuple(self.outcomes))
        status = (RunStatus.NEEDS_ATTENTION if result.needs_attention
                  else RunStatus.COMPENSATING if result.waiting else RunStatus.COMPENSATED)
        if self.within is not None and status == RunStatus.COMPENSATED:
            return result  # part of a run undone: it runs again (``stateguard.rewind``)
        self.journal.run_set_status(self.run_id, status, self.cause.error)
        emit(self.on_event, Event("run.status", self.run_id, data={"status": str(status)}))
        return result


def unwind(journal: Journal, run_id: str, spec: GuardSpec, cause: Cause, *,
           include_in_doubt: bool = False, triggered_by: str = "automatic",
           fallback_state: Any = None, on_event: EventCallback | None = None,
           sleep: Callable[[float], None] = time.sleep,
           check: Callable[[], None] = lambda: None, only: str | None = None,
           within: frozenset[str] | None = None) -> UnwindReport:
    """Compensate every step of ``run_id`` that had its effect, newest first (see module doc).

    Each compensation gets the state journaled right after its step; ``fallback_state`` (a
    value, or a zero-argument callable computed on first need) stands in for steps that have
    none, such as a step left in doubt by a dead process. ``check`` runs before every attempt
    and raises to stop (the lease was lost: another process owns the unwind now). ``only``
    (a step id) runs that step's compensation alone, even for a step in doubt (an operator
    retrying it has decided); the others keep their outcomes. ``within`` (step ids) undoes
    those steps only, and leaves the run ``compensating`` once they are undone, for the retry
    from an earlier step that asked (``stateguard.rewind``) to run it again."""
    u = _Unwinder(journal, run_id, spec, cause, include_in_doubt=include_in_doubt,
                  triggered_by=triggered_by, fallback_state=fallback_state, on_event=on_event,
                  check=check, only=only, within=within)
    for attempt, ctx, state in u.attempts():
        started = time.time()
        try:
            with recording(journal, run_id, ctx.step_id, ctx.node):
                result = attempt.fn(state, ctx)
                if inspect.isawaitable(result):
                    result = _run_coroutine(result)
            error: BaseException | None = None
        except Exception as exc:
            result, error = None, exc
        delay = u.record(attempt, started, result, error)
        if delay:
            sleep(delay)
    return u.report()


async def aunwind(journal: Journal, run_id: str, spec: GuardSpec, cause: Cause, *,
                  include_in_doubt: bool = False, triggered_by: str = "automatic",
                  fallback_state: Any = None, on_event: EventCallback | None = None,
                  check: Callable[[], None] = lambda: None, only: str | None = None,
                  within: frozenset[str] | None = None) -> UnwindReport:
    """``unwind`` for asyncio: awaits async compensations, runs sync ones in a thread."""
    u = _Unwinder(journal, run_id, spec, cause, include_in_doubt=include_in_doubt,
                  triggered_by=triggered_by, fallback_state=fallback_state, on_event=on_event,
                  check=check, only=only, within=within)
    for attempt, ctx, state in u.attempts():
        started = time.time()
        try:
            with recording(journal, run_id, ctx.step_id, ctx.node):  # to_thread copies it
                if inspect.iscoroutinefunction(attempt.fn):
                    result = await attempt.fn(state, ctx)
                else:
                    result = await asyncio.to_thread(attempt.fn, state, ctx)
                    if inspect.isawaitable(result):
                        result = await result
            error: BaseException | None = None
        except Exception as exc:
            result, error = None, exc
        delay = u.record(attempt, started, result, error)
        if delay:
            await asyncio.sleep(delay)
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
    with ThreadPoolExecutor(max_workers=1) as pool:  # in this context (where effects go)
        return pool.submit(contextvars.copy_context().run, asyncio.run, wait()).result()
