"""StateGuard's exceptions.

The tree::

    StateGuardError
    ├── ConfigurationError (ValueError)   bad invariants, compensations or approvals
    ├── RunLocked (RuntimeError)          another process holds the run's lease
    │   └── LeaseLost                     a write fenced out: the writer's lease was taken over
    ├── RunNotFound (LookupError)         no journaled run under that id
    ├── InvalidRunState (RuntimeError)    the action does not fit the run's status (an operator's,
    │                                     or an invoke: a Command for an approval gate, new input
    │                                     over effects not settled)
    ├── InvariantViolation (RuntimeError) an invariant failed after (or before) a node
    ├── ApprovalRejected (RuntimeError)   an operator rejected a gated step
    ├── ToolCallFailed (RuntimeError)     a tool error the model was told of unwinds the run
    ├── RunTerminated (RuntimeError)      an operator stopped the run (``guard.terminate``)
    ├── CompensationFailed                a compensation failed on every attempt
    └── SagaAborted (RuntimeError)        the run stopped and was unwound; carries the report

The ones raised *inside* a LangGraph node subclass ``RuntimeError`` on purpose: LangGraph's default
``RetryPolicy`` retries any other ``Exception`` subclass, and re-running a node because an invariant
failed would repeat its external effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stateguard.report import UnwindReport


class StateGuardError(Exception):
    """Base class of every error StateGuard raises."""


class ConfigurationError(StateGuardError, ValueError):
    """The guard was configured with something it cannot use (raised at construction)."""


class RunLocked(StateGuardError, RuntimeError):
    """Another owner holds the run's lease; try again later or let the sweeper recover it."""

    def __init__(self, run_id: str, owner: str | None = None) -> None:
        self.run_id = run_id
        self.owner = owner
        held = f" by {owner!r}" if owner else ""
        super().__init__(f"run {run_id!r} is locked{held}")


class LeaseLost(RunLocked):
    """A journal refused a write because the writer's lease on the run was taken over (another
    process holds it now, under a newer fencing token): the run is that process's, and this one
    must not act on it any more. A stalled worker that wakes after its lease expired gets this
    from ``PostgresJournal`` instead of writing over the run's recovery."""


class RunNotFound(StateGuardError, LookupError):
    """The journal has no run under that id (never started, or forgotten: deleted, or beyond
    ``InMemoryJournal``'s cap of finished runs)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in the journal")


class InvalidRunState(StateGuardError, RuntimeError):
    """An operator action that does not fit the run's current status."""


class InvariantViolation(StateGuardError, RuntimeError):
    """An invariant did not hold on the state after ``node``'s writes (or before ``node`` ran)."""

    def __init__(self, invariant: str, message: str, *, node: str | None = None,
                 phase: str = "after") -> None:
        self.invariant = invariant
        self.message = message
        self.node = node
        self.phase = phase
        where = f" {phase} node {node!r}" if node else ""
        super().__init__(f"invariant {invariant!r} violated{where}: {message}")


class ApprovalRejected(StateGuardError, RuntimeError):
    """An operator rejected the approval of a gated step (``node``: a node or a tool): the step
    never ran, and the run was unwound. ``by`` and ``reason`` say who and why."""

    def __init__(self, node: str, *, by: str | None = None, reason: str = "") -> None:
        self.node = node
        self.by = by
        self.reason = reason
        who = f" by {by}" if by else ""
        why = f": {reason}" if reason else ""
        super().__init__(f"approval of node {node!r} rejected{who}{why}")


class ToolCallFailed(StateGuardError, RuntimeError):
    """A tool call failed and ``ToolNode`` told the model (``handle_tool_errors``), but the
    guard's ``on_tool_error`` policy unwinds the run instead: its node fails with this."""

    def __init__(self, tool: str, tool_call_id: str, message: str) -> None:
        self.tool = tool
        self.tool_call_id = tool_call_id
        self.message = message
        super().__init__(f"tool call {tool!r} ({tool_call_id}) failed: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tool, self.tool_call_id, self.message))


class RunTerminated(StateGuardError, RuntimeError):
    """An operator asked the run to stop (``guard.terminate``): raised at its next step
    boundary, in the run's own thread, so that the guard unwinds or holds it as asked. The
    caller of ``invoke`` gets ``SagaAborted`` with this as its ``cause``; ``stop`` is the
    ``stateguard.stops.StopRequest``."""

    def __init__(self, run_id: str, stop: Any, *, node: str | None = None) -> None:
        self.run_id = run_id
        self.stop = stop
        self.node = node
        before = f" before {node!r}" if node else ""
        super().__init__(f"run {run_id!r} stopped{before}: {stop.describe()}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_terminated, (self.run_id, self.stop, self.node))


def _terminated(run_id: str, stop: Any, node: str | None) -> RunTerminated:
    return RunTerminated(run_id, stop, node=node)


class CompensationFailed(StateGuardError):
    """A compensation raised on every attempt; ``errors`` holds one message per attempt."""

    def __init__(self, node: str, errors: list[str]) -> None:
        self.node = node
        self.errors = errors
        super().__init__(f"compensation of {node!r} failed {len(errors)} time(s): {errors[-1:]}")


class SagaAborted(StateGuardError, RuntimeError):
    """The run stopped (error, violation, rejection or an operator) and its steps were unwound.

    ``cause`` is what stopped it; ``report`` says what each compensation did. When the report's
    ``needs_attention`` is true, at least one effect could not be undone and an operator must look.
    """

    def __init__(self, cause: BaseException | None, report: UnwindReport,
                 *, reason: str | None = None) -> None:
        self.cause = cause
        self.report = report
        what = reason or (f"{type(cause).__name__}: {cause}" if cause else "operator request")
        super().__init__(f"saga {report.run_id!r} aborted by {what}; {report.summary()}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.cause, self.report))
