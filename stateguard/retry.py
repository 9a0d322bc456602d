"""Retry settings for compensations: exponential backoff with full jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass

from stateguard.exceptions import ConfigurationError


@dataclass(frozen=True, slots=True)
class CompensationRetry:
    """How often and how patiently a compensation is retried before the run needs attention.

    The delay before attempt ``n + 1`` is ``min(cap, initial * factor ** (n - 1))``, scaled by a
    random factor in ``[1 - jitter, 1]`` so that many failing runs do not retry in lockstep.

    Example: ``CompensationRetry(attempts=5, initial=0.2, cap=5.0)``.
    """

    attempts: int = 5
    initial: float = 0.1
    factor: float = 2.0
    cap: float = 5.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise ConfigurationError("CompensationRetry.attempts must be an int")
        numbers = (self.initial, self.factor, self.cap, self.jitter)
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
            raise ConfigurationError("CompensationRetry delays must be numbers")
        if self.attempts < 1:
            raise ConfigurationError("CompensationRetry.attempts must be at least 1")
        if self.initial < 0 or self.cap < 0 or self.factor < 1:
            raise ConfigurationError("CompensationRetry needs initial >= 0, cap >= 0, factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError("CompensationRetry.jitter must be within [0, 1]")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.cap, self.initial * self.factor ** (attempt - 1))
        return base * (1 - self.jitter * random.random())
