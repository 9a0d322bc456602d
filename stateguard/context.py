"""``ExceptionContext``: what a compensation is told about the failure it is undoing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from stateguard.records import ErrorInfo
from stateguard.tool_calls import ToolCall


def idempotency_key(run_id: str, step_id: str) -> str:
    """Stable for one step's compensation: the same value on every attempt and every re-run."""
    digest = hashlib.sha256(f"{run_id}\x00{step_id}".encode()).hexdigest()
    return f"sg-{digest[:32]}"


@dataclass(frozen=True, slots=True)
class InvariantInfo:
    name: str
    message: str


@dataclass(frozen=True, slots=True)
class ExceptionContext:
    """Passed to every compensation as ``fn(state, ctx)``.

    A tool call's compensation (keyed by the tool's name) reads the call in ``ctx.tool_call``::

        def refund_charge_card(state, ctx):
            charge_id = ctx.tool_call.result["charge_id"]   # what charge_card returned
            stripe.Refund.create(charge=charge_id, idempotency_key=ctx.idempotency_key)
            return True

    Example::

        def refund_stripe_charge(state, ctx):
            if not state.get("charge_id"):
                return False                      # nothing to undo
            stripe.Refund.create(charge=state["charge_id"],
                                 idempotency_key=ctx.idempotency_key)
            return True
    """

    run_id: str  # the LangGraph thread id
    node: str  # the step being compensated
    step_id: str
    step_result: Any  # what that step wrote
    attempt: int  # 1-based attempt of this compensation
    idempotency_key: str  # same on every retry of this compensation: pass it to Stripe & co.
    reason: str  # "error", "invariant", "rejected", "operator", "crash", "retry"
    failed_node: str | None = None  # the node that raised or violated, if any
    error: ErrorInfo | None = None
    invariant: InvariantInfo | None = None
    in_doubt: bool = False  # the step started but its outcome is unknown (the process died)
    # When the step is a tool call: its id, name, arguments and result (content, artifact).
    tool_call: ToolCall | None = None

    @property
    def thread_id(self) -> str:
        return self.run_id

    def __str__(self) -> str:
        parts = [f"compensating {self.node!r} (attempt {self.attempt}) of run {self.run_id!r}",
                 f"because of {self.reason}"]
        if self.failed_node:
            parts.append(f"at node {self.failed_node!r}")
        if self.invariant:
            parts.append(f"invariant {self.invariant.name!r}: {self.invariant.message}")
        elif self.error:
            parts.append(str(self.error))
        if self.in_doubt:
            parts.append("step in doubt")
        return "; ".join(parts) + f" [key {self.idempotency_key}]"
