"""A seam for fault injection: ``StateGuardCheckpointer(fault_hook=...)``.

The guard calls the hook at two points of every step body it runs (a node's, a tool call's, a
``@task`` call's), in both forms, sync and async:

- ``"before"``: the step is journaled started, its body is about to run;
- ``"after"``: the body returned (its effect happened), its outcome is not journaled yet.

Whatever the hook raises is raised from the body at that point, so the guard handles it as it
would the body's own: an ``Exception`` fails the step (before: no effect; after: the effect
happened and the step raised, as a provider's lost answer leaves it); a ``BaseException`` that
is no ``Exception`` leaves the step started, in doubt, the run as a dead process leaves it (as
``KeyboardInterrupt`` does: docs/core.md). A body the guard replays from the journal (a tool
call or a task that already succeeded) runs no body, so no hook. ``stateguard.testing`` (the
saga chaos harness) injects its faults through it; leave it ``None`` in production.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from stateguard.core import GuardCore

__all__ = ["FaultHook", "FaultPoint", "fault_point"]

StepShape = Literal["node", "tool_call", "task"]


@dataclass(frozen=True, slots=True)
class FaultPoint:
    """Where a step's body stands when the guard calls its ``fault_hook``.

    ``where``: ``"before"`` or ``"after"`` the body; ``name``: the node's, tool's or task's
    name (what compensations are keyed by); ``shape``: ``"node"``, ``"tool_call"`` or
    ``"task"``; ``attempt``: 1, then 2... for the attempts of a retriable step."""

    where: Literal["before", "after"]
    run_id: str
    step_id: str
    name: str
    shape: StepShape
    attempt: int = 1


FaultHook = Callable[[FaultPoint], None]


def fault_point(core: GuardCore, where: Literal["before", "after"], run_id: str,
                step_id: str, name: str, shape: StepShape, attempt: int) -> None:
    """Call the guard's ``fault_hook`` (if it has one) at this point of a step's body."""
    hook = core.fault_hook
    if hook is not None:
        hook(FaultPoint(where, run_id, step_id, name, shape, attempt))
