"""Retry settings for compensations: exponential backoff with full jitter, in the process;
then, with ``RetryLater``, durable waits between rounds of attempts."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from stateguard.exceptions import ConfigurationError

Permanent = Callable[[BaseException], bool]


@dataclass(frozen=True, slots=True)
class RetryLater:
    """What a compensation does once its attempts in the process are spent: wait, durably, and
    try a new round of attempts, until ``budget`` seconds after its first attempt; only then
    (or on a permanent error) does the run need a person.

    The wait is as long as the compensation has been failing so far (so it doubles), at least
    ``initial`` and at most ``cap`` seconds. Nothing sleeps meanwhile: the compensation is
    journaled ``waiting`` with its ``retry_at``, the run stays ``compensating``, and whoever
    runs ``guard.recover(graph, config)`` on it after that time (the web app's sweeper) runs
    the next round. A process that dies meanwhile loses nothing.

    Example: ``CompensationRetry(attempts=5, later=RetryLater(initial=30, cap=3600,
    budget=24 * 3600))``: a Stripe outage of an hour is waited out, not handed to a person."""

    initial: float = 30.0
    cap: float = 3600.0
    budget: float = 24 * 3600.0

    def __post_init__(self) -> None:
        numbers = (self.initial, self.cap, self.budget)
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
            raise ConfigurationError("RetryLater's times must be numbers of seconds")
        if not 0 < self.initial <= self.cap or self.budget <= 0:
            raise ConfigurationError("RetryLater needs 0 < initial <= cap and budget > 0")

    def retry_at(self, first_attempt: float, now: float) -> float | None:
        """When to try again, given when the first attempt started; ``None``: the budget is
        spent."""
        failing, left = now - first_attempt, first_attempt + self.budget - now
        if left <= 0:
            return None
        return now + min(left, self.cap, max(self.initial, failing))


@dataclass(frozen=True, slots=True)
class CompensationRetry:
    """How often and how patiently a compensation is retried before the run needs attention.

    The delay before attempt ``n + 1`` is ``min(cap, initial * factor ** (n - 1))``, scaled by a
    random factor in ``[1 - jitter, 1]`` so that many failing runs do not retry in lockstep.

    Example: ``CompensationRetry(attempts=5, initial=0.2, cap=5.0)``.

    ``later`` (a ``RetryLater``) waits and tries again once the attempts are spent, instead of
    handing the run to a person at once. ``permanent(exc)`` says an error will not go away by
    trying again (a provider's 4xx: a refund of a charge it does not know): no more attempts,
    now or later; the run needs a person.
    """

    attempts: int = 5
    initial: float = 0.1
    factor: float = 2.0
    cap: float = 5.0
    jitter: float = 0.5
    later: RetryLater | None = None
    permanent: Permanent | None = None

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
        if self.later is not None and not isinstance(self.later, RetryLater):
            raise ConfigurationError("CompensationRetry.later must be a RetryLater")
        if self.permanent is not None and not callable(self.permanent):
            raise ConfigurationError("CompensationRetry.permanent must be a function of the "
                                     "error, returning whether it is permanent")

    def is_permanent(self, error: BaseException) -> bool:
        """Whether ``error`` will not go away by trying again (``permanent`` says; a policy
        that raises is taken to say no: the compensation keeps its attempts)."""
        if self.permanent is None:
            return False
        try:
            return bool(self.permanent(error))
        except Exception:
            return False

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.cap, self.initial * self.factor ** (attempt - 1))
        return base * (1 - self.jitter * random.random())
