"""``GuardedState``: the saga for plain Python code that is not a LangGraph graph."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from stateguard.core import GuardCore
from stateguard.effects import recording
from stateguard.events import Event, EventCallback, emit
from stateguard.exceptions import (
    ConfigurationError,
    InvalidRunState,
    InvariantViolation,
    RunLocked,
    SagaAborted,
)
from stateguard.journal import Journal, TurnJournal
from stateguard.lifecycle import NEXT_TURN, Action, check, refusal
from stateguard.records import ErrorInfo, RunStatus, StepStatus
from stateguard.report import UnwindReport
from stateguard.retry import CompensationRetry
from stateguard.unwind import Cause

StepFn = Callable[[dict[str, Any]], Any]


class GuardedState:
    """Run steps of plain code as a saga: journaled, invariant-checked, unwound on failure.

    Example::

        with GuardedState({"balance": 100}, run_id="order-42",
                          invariants=[no_negative_balance],
                          compensations={"charge": refund}) as saga:
            saga.step("charge", lambda s: {"charge_id": charge(s), "balance": s["balance"] - 30})
            saga.step("ship", ship)
        # on any exception inside the block: compensations newest first, then SagaAborted

    A step function gets the current state (a dict) and returns a dict of updates (or None).
    Updates replace keys; invariants run on the state after every step.
    """

    def __init__(self, state: Mapping[str, Any] | None = None, *, run_id: str,
                 invariants: Iterable[Any] = (), compensations: Mapping[str, Any] | None = None,
                 compensation_retry: CompensationRetry | None = None,
                 journal: Journal | None = None, on_event: EventCallback | None = None,
                 lease_ttl: float = 60.0) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ConfigurationError("GuardedState needs a non-empty run_id")
        if getattr(journal, "defers_steps", False):
            raise ConfigurationError("this journal writes step rows with LangGraph checkpoints "
                                     "(defers_steps); plain code has none: use another journal")
        self.core = GuardCore(invariants=invariants, compensations=compensations,
                              compensation_retry=compensation_retry, journal=journal,
                              on_event=on_event, lease_ttl=lease_ttl)
        self.run_id = run_id
        self.state: dict[str, Any] = dict(state or {})
        self.report: UnwindReport | None = None
        self._lease: contextlib.ExitStack | None = None
        self._count = 0

    # -- the block --------------------------------------------------------------------------
    def __enter__(self) -> GuardedState:
        stack = contextlib.ExitStack()
        stack.enter_context(self.core.lease(self.run_id))
        self._lease = stack
        journal = self.core.journal
        run = journal.run_begin(self.run_id)
        if run.status in NEXT_TURN and isinstance(journal, TurnJournal):
            journal.run_next_turn(self.run_id)  # a block entered again: a saga of its own
        self._count = len(journal.steps(self.run_id))  # step ids stay unique across turns
        self.core.set_status(self.run_id, RunStatus.RUNNING)
        found = self.core.spec.first_violation(self.state)
        if found is not None:  # raises SagaAborted, with nothing to undo yet
            exc = InvariantViolation(found[0].name, found[1], phase="before the first step")
            self.__exit__(InvariantViolation, exc, None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._lease is None:
            raise InvalidRunState("GuardedState block was not entered")
        lease, self._lease = self._lease, None  # steps after the block are refused
        with lease:
            if exc_type is None:
                self.core.set_status(self.run_id, RunStatus.SUCCEEDED)
                return
            if exc is None or not isinstance(exc, Exception) or isinstance(exc, RunLocked):
                # KeyboardInterrupt & co. leave the run in doubt for recovery; a lost lease
                # leaves it to whoever took it over.
                return
            self.report = self.core.unwind(self.run_id, self.core.cause_of(exc),
                                           fallback_state=dict(self.state))
        raise SagaAborted(exc, self.report) from exc

    async def __aenter__(self) -> GuardedState:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- steps ------------------------------------------------------------------------------
    def step(self, name: str, fn: StepFn, *, tags: Iterable[str] = ()) -> dict[str, Any]:
        """Run ``fn(state)`` as the step ``name``; returns the new state."""
        step_id = self._start(name, tuple(tags))
        try:
            with recording(self.core.journal, self.run_id, step_id, name):
                result = fn(dict(self.state))
        except Exception as exc:
            self._fail(name, step_id, exc)
            raise
        return self._finish(name, step_id, result)

    async def astep(self, name: str, fn: Callable[[dict[str, Any]], Any], *,
                    tags: Iterable[str] = ()) -> dict[str, Any]:
        step_id = self._start(name, tuple(tags))
        try:
            with recording(self.core.journal, self.run_id, step_id, name):
                result = fn(dict(self.state))
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            self._fail(name, step_id, exc)
            raise
        return self._finish(name, step_id, result)

    def _start(self, name: str, tags: tuple[str, ...]) -> str:
        if self._lease is None:
            raise InvalidRunState("call step() inside `with GuardedState(...)`")
        self._count += 1
        step_id = f"{self._count}:{name}"
        self.core.check_lease(self.run_id)
        self.core.journal.step_start(self.run_id, step_id, name, tags)
        emit(self.core.on_event, Event("step.started", self.run_id, name, step_id))
        return step_id

    def _fail(self, name: str, step_id: str, exc: Exception,
              status: StepStatus = StepStatus.FAILED) -> None:
        error = ErrorInfo.from_exception(exc)
        self.core.journal.step_finish(self.run_id, step_id, status, error=error)
        emit(self.core.on_event, Event("step.failed", self.run_id, name, step_id,
                                       {"error": str(error)}))
        with contextlib.suppress(AttributeError):
            exc.stateguard_node = name  # type: ignore[attr-defined]

    def _finish(self, name: str, step_id: str, result: Any) -> dict[str, Any]:
        if result is not None and not isinstance(result, Mapping):
            exc = TypeError(f"step {name!r} returned {type(result).__name__}; "
                            "a step returns a dict of state updates or None")
            # The body ran, so its effect happened: it is compensated like a violation.
            self._fail(name, step_id, exc, StepStatus.VIOLATED)
            raise exc
        update = dict(result or {})
        after = {**self.state, **update}
        found = self.core.spec.first_violation(after)
        if found is None:
            self.core.journal.step_finish(self.run_id, step_id, StepStatus.SUCCEEDED,
                                          update=update, state_after=after)
            emit(self.core.on_event, Event("step.succeeded", self.run_id, name, step_id))
            self.state = after
            return dict(after)
        violation = InvariantViolation(found[0].name, found[1], node=name)
        self.core.journal.step_finish(self.run_id, step_id, StepStatus.VIOLATED, update=update,
                                      state_after=after,
                                      error=ErrorInfo.from_exception(violation))
        emit(self.core.on_event, Event("invariant.violated", self.run_id, name, step_id,
                                       {"invariant": found[0].name, "message": found[1]}))
        self.state = after
        raise violation

    # -- operator / recovery ----------------------------------------------------------------
    def compensate(self, *, by: str = "operator", reason: str = "operator") -> UnwindReport:
        """Unwind this run from the journal (for example from a new process after a crash)."""
        with self.core.lease(self.run_id):
            run = self.core.journal.run_get(self.run_id)
            status = run.status if run is not None else RunStatus.RUNNING
            # Under the lease: a run settled meanwhile (resolved by hand, say) is refused.
            crashed = refusal(Action.RECOVER, status) is None
            if not crashed:
                check(Action.COMPENSATE, status, run=self.run_id)
            self.report = self.core.unwind(self.run_id, Cause(reason), triggered_by=by,
                                           include_in_doubt=crashed,
                                           fallback_state=dict(self.state))
        return self.report
