"""Errors as an operator reads them: one line in plain words ("Stripe unreachable (connection
refused)"), with the raw text (an SDK's message, the traceback) kept a click away, and the
attempts of a compensation that failed the same way shown once ("5 attempts").

The journal keeps each error as ``{"type", "message", "traceback"}`` (the exception's class name,
``str()`` and traceback: ``stateguard.records.ErrorInfo``). ``summary`` words the ones an
operator meets in an outage (a provider that cannot be reached, that fails on its side, that
slows us down) and shows any other as its type and the first line of its message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_FIRST_LINE = 160  # characters of a message's first line that a summary shows

# Why a connection failed, as urllib3, requests, httpx and the OS word it in their messages.
_NETWORK = (
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"timed? ?out", re.I), "timed out"),
    (re.compile(r"name or service not known|nodename nor servname|getaddrinfo|name resolution",
                re.I), "host not found"),
    (re.compile(r"remote ?disconnected|connection (aborted|reset)|without (a )?response", re.I),
     "connection dropped"),
)
# The Stripe SDK's errors (stripe._error), by class name, in words.
_STRIPE = {
    "APIConnectionError": "Stripe unreachable",
    "APIError": "Stripe failed on its side",
    "RateLimitError": "Stripe asked to slow down (rate limit)",
    "AuthenticationError": "Stripe refused the API key",
    "PermissionError": "Stripe refused: the API key may not do this",
    "CardError": "card declined",
    "InvalidRequestError": "Stripe refused the request",
    "IdempotencyError": "Stripe refused the idempotency key",
}
# Python's own connection errors.
_OS = {"ConnectionRefusedError": "connection refused", "TimeoutError": "timed out",
       "ConnectionResetError": "connection dropped", "ConnectionAbortedError":
       "connection dropped", "BrokenPipeError": "connection dropped"}
# What differs on every request although the error is the same: object addresses, Stripe's
# request ids.
_VARYING = re.compile(r"0x[0-9a-fA-F]{6,}|\breq_[A-Za-z0-9]+")


def _parts(error: Any) -> tuple[str, str, str]:
    if not isinstance(error, dict):
        return "", "" if error is None else str(error), ""
    return (str(error.get("type") or ""), str(error.get("message") or ""),
            str(error.get("traceback") or ""))


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= _FIRST_LINE else line[:_FIRST_LINE - 1] + "…"


def _cause(message: str) -> str:
    return next((words for pattern, words in _NETWORK if pattern.search(message)), "")


def summary(error: Any) -> str:
    """``error`` (as the journal keeps it) in one line of plain words."""
    kind, message, traceback = _parts(error)
    stripe = kind in _STRIPE and ("stripe" in message.lower() or "/stripe/" in traceback)
    if stripe and kind == "APIConnectionError":
        cause = _cause(message)
        return _STRIPE[kind] + (f" ({cause})" if cause else "")
    if stripe:
        detail = _first_line(_VARYING.sub("", message).removeprefix("Request : "))
        return f"{_STRIPE[kind]}: {detail}" if detail else _STRIPE[kind]
    if kind in _OS:
        return _OS[kind]
    first = _first_line(message)
    return f"{kind}: {first}" if kind and first else kind or first


def raw(error: Any) -> str:
    """``error``'s type and whole message, as it was raised."""
    kind, message, _ = _parts(error)
    return f"{kind}: {message}" if kind and message else kind or message


@dataclass(frozen=True, slots=True)
class AttemptGroup:
    """Consecutive attempts of a compensation that ended the same way."""

    first: int  # attempt numbers
    last: int
    ok: bool
    started_at: datetime
    finished_at: datetime
    result: str  # an ok attempt's
    error: Any  # the first failed attempt's, whole: the raw text shown
    summary: str

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def _same(error: Any) -> tuple[str, str]:
    kind, message, _ = _parts(error)
    return kind, _VARYING.sub("", message)


def group_attempts(attempts: Iterable[Any]) -> list[AttemptGroup]:
    """``attempts`` (``CompensationAttempt``s, in order) as groups of consecutive ones that
    ended the same way: the same result, or the same error but for what differs on every
    request (an object's address, a request id)."""
    groups: list[AttemptGroup] = []
    keys: list[tuple[Any, ...]] = []
    for attempt in attempts:
        key = (attempt.ok, attempt.result if attempt.ok else _same(attempt.error))
        if groups and keys[-1] == key and groups[-1].last + 1 == attempt.number:
            previous = groups[-1]
            groups[-1] = AttemptGroup(previous.first, attempt.number, previous.ok,
                                      previous.started_at, attempt.finished_at,
                                      previous.result, previous.error, previous.summary)
            continue
        keys.append(key)
        groups.append(AttemptGroup(attempt.number, attempt.number, attempt.ok,
                                   attempt.started_at, attempt.finished_at, attempt.result,
                                   None if attempt.ok else attempt.error,
                                   "" if attempt.ok else summary(attempt.error)))
    return groups
