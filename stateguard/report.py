"""``UnwindReport``: what an unwind did, step by step, newest step first."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stateguard.exceptions import CompensationFailed
from stateguard.records import STUCK_COMPENSATIONS, CompensationStatus, ErrorInfo


@dataclass(frozen=True, slots=True)
class CompensationOutcome:
    node: str
    step_id: str
    status: CompensationStatus | str  # a CompensationStatus, or "no_compensation"/"already_done"
    attempts: int = 0
    errors: tuple[ErrorInfo, ...] = ()
    retry_at: float | None = None  # a waiting compensation's next round

    def __str__(self) -> str:
        text = f"{self.node}={self.status}"
        if self.attempts > 1:
            text += f" after {self.attempts} attempts"
        if self.retry_at is not None:
            text += f", tried again at {time.strftime('%H:%M:%S', time.localtime(self.retry_at))}"
        if self.errors and self.status in (CompensationStatus.FAILED, CompensationStatus.WAITING):
            text += f" (last error: {self.errors[-1]})"
        return text


@dataclass(frozen=True, slots=True)
class UnwindReport:
    run_id: str
    reason: str
    outcomes: tuple[CompensationOutcome, ...] = field(default_factory=tuple)
    # Why nothing was undone, when the run could not be unwound: it passed its pivot (the
    # point of no return, ``stateguard.kinds``) and waits for a person instead.
    held: str = ""

    @property
    def needs_attention(self) -> bool:
        return bool(self.held) or any(o.status in STUCK_COMPENSATIONS for o in self.outcomes)

    @property
    def waiting(self) -> bool:
        """Some compensation waits to be tried again (``RetryLater``): not undone yet."""
        return any(o.status == CompensationStatus.WAITING for o in self.outcomes)

    @property
    def compensated(self) -> list[str]:
        """Nodes whose effect was undone by this unwind, in the order they were undone."""
        return [o.node for o in self.outcomes if o.status == CompensationStatus.SUCCEEDED]

    def raise_if_needs_attention(self) -> None:
        """Raise ``CompensationFailed`` for the first effect that could not be undone."""
        for o in self.outcomes:
            if o.status in STUCK_COMPENSATIONS:
                raise CompensationFailed(o.node, [str(e) for e in o.errors])

    def summary(self) -> str:
        if self.held:
            return f"NEEDS ATTENTION; nothing undone: {self.held}"
        if not self.outcomes:
            return "nothing to compensate"
        state = ("NEEDS ATTENTION; " if self.needs_attention
                 else "WAITING TO RETRY; " if self.waiting else "")
        return state + "compensations: " + ", ".join(str(o) for o in self.outcomes)

    def __str__(self) -> str:
        return f"run {self.run_id!r} unwound ({self.reason}): {self.summary()}"
