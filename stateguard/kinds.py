"""Step kinds: compensatable → pivot → retriable (the Saga pattern's point of no return).

Some effects cannot be undone (an order shipped, a contract signed): the **pivot**. Before it,
steps are *compensatable*: a failure unwinds them. Once the pivot has had its effect, the run
only goes forward: steps after it are *retriable*, retried with their retry settings, and a
failure past their retries (or a broken invariant) holds the run ``needs_attention`` with the
reason, for an operator to retry forward once the cause is fixed (or resolve by hand); nothing is
undone, since undoing what came before the pivot would undo half a saga::

    guard = StateGuardCheckpointer(
        compensations={"charge": refund},
        kinds={"ship": "pivot", "send_receipt": Retriable(CompensationRetry(attempts=8))},
    )

Keys are node names, node tags, tool names or tool tags, as for compensations; a step with no
kind is compensatable. What is checked when the graph is validated (``guard.compile``, or a
drop-in graph's first run): every key names something of the graph; a pivot has no
compensation; and no node with a compensation is reachable only through a pivot (the edges
LangGraph can show: a ``Command(goto=...)`` with no declared destinations is not seen). What
only the run can tell (a model that calls a compensatable tool after the pivot tool, a loop
back to a compensatable node) is refused when that step is about to start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from langgraph.errors import GraphBubbleUp

from stateguard.exceptions import ConfigurationError, StateGuardError
from stateguard.journal import turn_steps
from stateguard.lifecycle import Pivot
from stateguard.records import EFFECT_STATUSES, StepRecord, StepStatus
from stateguard.retry import CompensationRetry

if TYPE_CHECKING:
    from stateguard.core import GuardCore

__all__ = ["Retriable", "StepKind", "build_kinds", "check_step_retry", "held_reason",
           "kind_keywords", "pivot_of", "pivot_state", "reachable_only_after",
           "refusal_after_pivot", "retry_delay"]


class StepKind(StrEnum):
    COMPENSATABLE = "compensatable"  # undone by its compensation when the run unwinds
    PIVOT = "pivot"  # the point of no return: once it had its effect, nothing is undone
    RETRIABLE = "retriable"  # retried until it succeeds; after the pivot, failures go forward


@dataclass(frozen=True, slots=True)
class Retriable:
    """A retriable step with retry settings of its own (``kinds={"email": Retriable(retry)}``);
    the string ``"retriable"`` takes the guard's ``step_retry``.

    The settings are a ``CompensationRetry``: attempts, backoff and ``permanent`` (an error no
    attempt will fix fails the step at once). ``later`` is refused: a step's attempts run while
    its node runs, and nothing waits durably in the middle of a node."""

    retry: CompensationRetry | None = None

    def __post_init__(self) -> None:
        check_step_retry(self.retry, "Retriable.retry")


def check_step_retry(retry: Any, what: str) -> None:
    if retry is None:
        return
    if not isinstance(retry, CompensationRetry):
        raise ConfigurationError(f"{what} must be a CompensationRetry")
    if retry.later is not None:
        raise ConfigurationError(f"{what}: a step is retried while its node runs; it cannot "
                                 "wait durably (RetryLater is for compensations)")


def build_kinds(kinds: Mapping[str, Any] | None
                ) -> tuple[dict[str, StepKind], dict[str, CompensationRetry]]:
    """``kinds`` validated: key -> kind, and key -> the retry settings given with it."""
    if kinds is None:
        return {}, {}
    if not isinstance(kinds, Mapping):
        raise ConfigurationError("kinds must be a mapping of node, tool or tag to "
                                 f"{[k.value for k in StepKind]}")
    built: dict[str, StepKind] = {}
    retries: dict[str, CompensationRetry] = {}
    for key, value in kinds.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"kinds key {key!r} must be a node, tool or tag name")
        if isinstance(value, Retriable):
            built[key] = StepKind.RETRIABLE
            if value.retry is not None:
                retries[key] = value.retry
            continue
        try:
            built[key] = StepKind(value)
        except ValueError:
            raise ConfigurationError(
                f"kinds[{key!r}] is {value!r}; a step kind is one of "
                f"{[k.value for k in StepKind]} (or Retriable(retry=...))") from None
    return built, retries


def pivot_of(steps: Iterable[StepRecord]) -> tuple[StepRecord | None, StepRecord | None]:
    """Of a turn's steps: the pivot that had its effect (succeeded, or ran and broke an
    invariant), and a pivot in doubt (started, never finished: its process died in it)."""
    passed = doubtful = None
    for step in steps:
        if step.kind != StepKind.PIVOT:
            continue
        if step.status in EFFECT_STATUSES and passed is None:
            passed = step
        elif step.status == StepStatus.STARTED and doubtful is None:
            doubtful = step
    return passed, doubtful


def pivot_state(steps: Iterable[StepRecord], *, unwound: bool = False) -> Pivot | None:
    """Where a run whose turn had these ``steps`` stands to its pivot, for the operators' rules
    (``stateguard.lifecycle``: no unwind past a pivot, a retry forward); ``unwound``: whether a
    step of the turn was compensated all the same. ``None`` if it has not reached a pivot."""
    passed, doubtful = pivot_of(steps)
    if passed is not None:
        return Pivot(passed.node, unwound=unwound)
    if doubtful is not None:
        return Pivot(doubtful.node, in_doubt=True)
    return None


def held_reason(steps: Iterable[StepRecord]) -> str | None:
    """Why a failed run whose turn had these steps is held for a person instead of unwound
    (it passed its pivot, or stopped inside it); ``None`` if it may be unwound."""
    passed, doubtful = pivot_of(steps)
    if passed is not None:
        return (f"the run passed its pivot {passed.node!r}, the point of no return, so it goes "
                "forward only; once the cause is fixed, retry it (or resolve it by hand)")
    if doubtful is not None:
        return (f"the run stopped inside its pivot {doubtful.node!r}: whether that happened is "
                "unknown; a person checks, then resolves it by hand")
    return None


def reachable_only_after(builder: Any, pivots: set[str]) -> set[str]:
    """The nodes of a ``StateGraph`` builder that every path from START reaches through a node
    of ``pivots`` (the pivots themselves excluded), along the edges the builder declares:
    plain and waiting edges, conditional edges (to every node when they name no
    destinations), a node's declared ``Command`` destinations, and error handlers."""
    nodes = set(getattr(builder, "nodes", {}))
    succ: dict[str, set[str]] = {}
    for start, end in getattr(builder, "edges", ()):
        succ.setdefault(start, set()).add(end)
    for source, branches in getattr(builder, "branches", {}).items():
        for branch in branches.values():
            ends = getattr(branch, "ends", None)
            succ.setdefault(source, set()).update(ends.values() if ends else nodes)
    for name, spec in getattr(builder, "nodes", {}).items():
        ends = getattr(spec, "ends", None) or ()
        succ.setdefault(name, set()).update(ends.values() if isinstance(ends, dict) else ends)
        handler = getattr(spec, "error_handler_node", None)
        if handler:
            succ[name].add(handler)
    joins = [(set(starts), end) for starts, end in getattr(builder, "waiting_edges", ())]

    def reach(blocked: set[str]) -> set[str]:
        seen: set[str] = set()
        todo = ["__start__"]
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if node not in blocked:
                todo.extend(succ.get(node, ()))
            if not todo:  # a join fires once all of its sources can run without a pivot
                todo.extend(end for starts, end in joins if end not in seen
                            and starts <= seen and not starts & blocked)
        return seen

    return (reach(set()) - reach(pivots)) & nodes - pivots


# -- while a run runs --------------------------------------------------------------------------
def kind_keywords(kind: StepKind) -> dict[str, str]:
    """``step_start``'s ``kind`` keyword: given only for a step that is not compensatable, so a
    journal written before kinds existed serves every guard that declares none."""
    return {} if kind == StepKind.COMPENSATABLE else {"kind": kind.value}


def retry_delay(retry: CompensationRetry | None, exc: BaseException, attempt: int
                ) -> float | None:
    """Seconds to wait before running again a retriable step whose attempt number ``attempt``
    raised ``exc``; ``None``: no more attempts (not retriable, its attempts are spent, or the
    error is permanent, LangGraph's control flow, or the guard's own)."""
    if retry is None or not isinstance(exc, Exception):
        return None
    if isinstance(exc, (GraphBubbleUp, StateGuardError)):
        return None
    if retry.is_permanent(exc) or attempt >= retry.attempts:
        return None
    return retry.delay(attempt)


def refusal_after_pivot(core: GuardCore, run_id: str, name: str, tags: Iterable[str],
                        kind: StepKind) -> ConfigurationError | None:
    """The error that stops a step with a compensation from starting once its turn passed a
    pivot (its effect could never be undone); ``None`` when it may start. Read from the journal
    only for such a step of a guard that declares a pivot."""
    spec = core.spec
    if (not spec.has_pivot or kind != StepKind.COMPENSATABLE
            or spec.compensation_for(name, tags) is None):
        return None
    passed, _ = pivot_of(turn_steps(core.journal, run_id))
    if passed is None:
        return None
    return ConfigurationError(
        f"step {name!r} is compensatable but would run after the pivot {passed.node!r}, the "
        "point of no return: its effect could never be undone; make it retriable (kinds), or "
        "run it before the pivot")
