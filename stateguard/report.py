"""``UnwindReport``: what an unwind did, step by step, newest step first."""

from __future__ import annotations

from dataclasses import dataclass, field

from stateguard.records import CompensationStatus, ErrorInfo


@dataclass(frozen=True, slots=True)
class CompensationOutcome:
    node: str
    step_id: str
    status: CompensationStatus | str  # a CompensationStatus, or "no_compensation"/"already_done"
    attempts: int = 0
    errors: tuple[ErrorInfo, ...] = ()

    def __str__(self) -> str:
        text = f"{self.node}={self.status}"
        if self.attempts > 1:
            text += f" after {self.attempts} attempts"
        if self.errors and self.status == CompensationStatus.FAILED:
            text += f" (last error: {self.errors[-1]})"
        return text


@dataclass(frozen=True, slots=True)
class UnwindReport:
    run_id: str
    reason: str
    outcomes: tuple[CompensationOutcome, ...] = field(default_factory=tuple)

    @property
    def needs_attention(self) -> bool:
        return any(o.status in (CompensationStatus.FAILED, CompensationStatus.SKIPPED_IN_DOUBT)
                   for o in self.outcomes)

    @property
    def compensated(self) -> list[str]:
        """Nodes whose effect was undone by this unwind, in the order they were undone."""
        return [o.node for o in self.outcomes if o.status == CompensationStatus.SUCCEEDED]

    def raise_if_needs_attention(self) -> None:
        """Raise ``CompensationFailed`` for the first effect that could not be undone."""
        from stateguard.exceptions import CompensationFailed

        for o in self.outcomes:
            if o.status in (CompensationStatus.FAILED, CompensationStatus.SKIPPED_IN_DOUBT):
                raise CompensationFailed(o.node, [str(e) for e in o.errors])

    def summary(self) -> str:
        if not self.outcomes:
            return "nothing to compensate"
        state = "NEEDS ATTENTION; " if self.needs_attention else ""
        return state + "compensations: " + ", ".join(str(o) for o in self.outcomes)

    def __str__(self) -> str:
        return f"run {self.run_id!r} unwound ({self.reason}): {self.summary()}"
