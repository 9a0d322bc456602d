"""Terminate: an operator's request that a run stop now, and how the process running it learns.

A sync node body cannot be interrupted safely (its effect may be half made), so a run stops at
its next step boundary: before the next node (or ``@task``) starts, before an approval gate,
before a retriable step's next attempt. A run driven by ``ainvoke`` stops at once instead:
its graph's task is cancelled, and the step it was in stays ``started``, in doubt, as a
cancelled ``ainvoke`` leaves it (``stateguard.runner``). Then the run is unwound (``then=
"unwind"``: the compensations of its steps, newest first, ``ctx.reason == "terminated"``) or
held ``needs_attention`` with the operator's reason (``then="hold"``)::

    guard.terminate(graph, config, then="unwind", by="carol", reason="wrong customer")

In one process, ``Stops`` carries the request from the operator's thread to the run's. Across
processes the journal carries it (``stateguard.journal.StopJournal``, the web app's journal):
the guard asks it when it takes a run's lease and at each heartbeat of the lease, so a request
is seen within ``lease_heartbeat`` seconds, and by whoever recovers the run should its process
die first.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

from stateguard.exceptions import ConfigurationError
from stateguard.records import ErrorInfo

__all__ = ["THEN", "StopRequest", "Stops", "Then"]

Then = Literal["unwind", "hold"]
THEN: tuple[str, ...] = get_args(Then)


@dataclass(frozen=True, slots=True)
class StopRequest:
    """What an operator asked: stop the run, then unwind it or hold it. ``id`` names the request
    (a journal that keeps requests clears this one once it is carried out)."""

    then: Then = "unwind"
    by: str | None = None
    reason: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if self.then not in THEN:
            raise ConfigurationError(f"then must be one of {', '.join(THEN)}, not {self.then!r}")
        if not isinstance(self.reason, str):
            raise ConfigurationError("reason must be text")

    def describe(self) -> str:
        """``terminated by carol: wrong customer``."""
        return f"terminated by {self.by or 'an operator'}" + (
            f": {self.reason}" if self.reason else "")

    def error(self) -> ErrorInfo:
        """The run's error once it stopped: why, in the operator's words."""
        then = "unwound" if self.then == "unwind" else "held for an operator, as asked"
        return ErrorInfo("RunTerminated", f"{self.describe()} ({then})")


class Stops:
    """The stops asked of the runs this process holds, and how to cancel the async ones now.
    Thread-safe: the operator's thread, or the lease's heartbeat, asks; the run's thread reads
    at each step boundary (a dict lookup)."""

    def __init__(self) -> None:
        self._asked: dict[str, StopRequest] = {}
        self._cancel: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def ask(self, run_id: str, stop: StopRequest) -> None:
        with self._lock:
            first = run_id not in self._asked
            self._asked.setdefault(run_id, stop)  # the first request is the one carried out
            cancel = self._cancel.get(run_id) if first else None
        if cancel is not None:
            cancel()

    def get(self, run_id: str) -> StopRequest | None:
        return self._asked.get(run_id)

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._asked.pop(run_id, None)

    @contextmanager
    def cancelling(self, run_id: str, cancel: Callable[[], None]) -> Iterator[None]:
        """While the block runs, a stop asked of ``run_id`` calls ``cancel`` (thread-safe: it
        may be called from any thread), at once if one was asked already."""
        with self._lock:
            self._cancel[run_id] = cancel
            asked = run_id in self._asked
        if asked:
            cancel()
        try:
            yield
        finally:
            with self._lock:
                self._cancel.pop(run_id, None)
