"""``GuardCore``: what the LangGraph guard and ``GuardedState`` share: the validated spec, the
journal, the event callback, leases, and the unwind."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from stateguard.context import InvariantInfo
from stateguard.events import Event, EventCallback, emit
from stateguard.exceptions import (
    ApprovalRejected,
    ConfigurationError,
    InvariantViolation,
    RunLocked,
)
from stateguard.journal import InMemoryJournal, Journal
from stateguard.records import ErrorInfo, RunStatus
from stateguard.report import UnwindReport
from stateguard.retry import CompensationRetry
from stateguard.spec import (
    GuardSpec,
    build_approvals,
    build_compensations,
    build_invariants,
)
from stateguard.unwind import Cause, aunwind, unwind

logger = logging.getLogger("stateguard")


class GuardCore:
    def __init__(self, *, invariants: Iterable[Any] = (),
                 compensations: Mapping[str, Any] | None = None,
                 approvals: Iterable[str] | Mapping[str, Any] | None = None,
                 compensation_retry: CompensationRetry | None = None,
                 journal: Journal | None = None, on_event: EventCallback | None = None,
                 lease_ttl: float = 60.0, lease_heartbeat: float | None = None) -> None:
        if compensation_retry is not None and not isinstance(compensation_retry,
                                                             CompensationRetry):
            raise ConfigurationError("compensation_retry must be a CompensationRetry")
        if journal is not None and not isinstance(journal, Journal):
            raise ConfigurationError(f"{journal!r} does not implement the Journal protocol")
        if on_event is not None and not callable(on_event):
            raise ConfigurationError("on_event must be callable")
        if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
            raise ConfigurationError("lease_ttl must be a positive number of seconds")
        if lease_heartbeat is None:
            lease_heartbeat = lease_ttl / 3
        if not isinstance(lease_heartbeat, (int, float)) or not 0 < lease_heartbeat < lease_ttl:
            raise ConfigurationError("lease_heartbeat must be positive and below lease_ttl")
        self.spec = GuardSpec(build_invariants(invariants), build_compensations(compensations),
                              build_approvals(approvals), compensation_retry or CompensationRetry())
        self.journal: Journal = journal if journal is not None else InMemoryJournal()
        self.on_event = on_event
        self.lease_ttl = float(lease_ttl)
        self.lease_heartbeat = float(lease_heartbeat)
        self._held: dict[str, tuple[str, float]] = {}  # run id -> (owner, last renewal)
        self._lost: set[str] = set()  # runs whose lease the heartbeat found taken over

    # -- leases ------------------------------------------------------------------------------
    @contextmanager
    def lease(self, run_id: str) -> Iterator[str]:
        """Hold the run's lock while the body runs; ``RunLocked`` if another owner has it.

        Without it, two processes resuming one run both execute the next node (measured: a
        double charge)."""
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        if not self.journal.lock_acquire(run_id, owner, self.lease_ttl):
            held = self.journal.run_get(run_id)
            raise RunLocked(run_id, held.lock_owner if held else None)
        self._held[run_id] = (owner, time.monotonic())
        self._lost.discard(run_id)
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(run_id, owner, stop),
                                name=f"stateguard-lease-{run_id}", daemon=True)
        beat.start()
        try:
            yield owner
        finally:
            stop.set()
            beat.join()
            self._held.pop(run_id, None)
            self.journal.lock_release(run_id, owner)

    def _heartbeat(self, run_id: str, owner: str, stop: threading.Event) -> None:
        """Keep the lease alive while a long node or compensation runs."""
        try:
            while not stop.wait(self.lease_heartbeat):
                if not self.journal.lock_acquire(run_id, owner, self.lease_ttl):
                    self._lost.add(run_id)
                    return
                self._held[run_id] = (owner, time.monotonic())
        except Exception:
            logger.exception("lease heartbeat for run %s failed", run_id)
            self._lost.add(run_id)
        finally:
            # Journals with per-thread resources (a Django DB connection) may free them here.
            done = getattr(self.journal, "close_thread_resources", None)
            if callable(done):
                done()

    def check_lease(self, run_id: str) -> None:
        """Raise ``RunLocked`` if the heartbeat found this process's lease taken over."""
        if run_id in self._lost:
            raise RunLocked(run_id)

    def renew_lease(self, run_id: str) -> None:
        """Extend a lease this process holds, at most every third of its lifetime."""
        self.check_lease(run_id)
        held = self._held.get(run_id)
        if held is None or time.monotonic() - held[1] < self.lease_ttl / 3:
            return
        if not self.journal.lock_acquire(run_id, held[0], self.lease_ttl):
            # Someone recovered the run while we were slow: stop before the next effect.
            raise RunLocked(run_id)
        self._held[run_id] = (held[0], time.monotonic())

    # -- run status -------------------------------------------------------------------------
    def set_status(self, run_id: str, status: RunStatus, error: ErrorInfo | None = None) -> None:
        self.journal.run_set_status(run_id, status, error)
        emit(self.on_event, Event("run.status", run_id, data={"status": str(status)}))

    # -- unwind -----------------------------------------------------------------------------
    def cause_of(self, exc: BaseException | None, *, failed_node: str | None = None,
                 reason: str | None = None) -> Cause:
        if isinstance(exc, InvariantViolation):
            return Cause(reason or "invariant", exc.node or failed_node,
                         ErrorInfo.from_exception(exc), InvariantInfo(exc.invariant, exc.message))
        if isinstance(exc, ApprovalRejected):
            return Cause(reason or "rejected", exc.node, ErrorInfo.from_exception(exc))
        if exc is None:
            return Cause(reason or "operator", failed_node)
        node = getattr(exc, "stateguard_node", None) or failed_node
        return Cause(reason or "error", node, ErrorInfo.from_exception(exc))

    def unwind(self, run_id: str, cause: Cause, *, include_in_doubt: bool = False,
               triggered_by: str = "automatic", fallback_state: Any = None) -> UnwindReport:
        return unwind(self.journal, run_id, self.spec, cause, include_in_doubt=include_in_doubt,
                      triggered_by=triggered_by, fallback_state=fallback_state,
                      on_event=self.on_event, check=lambda: self.check_lease(run_id))

    async def aunwind(self, run_id: str, cause: Cause, *, include_in_doubt: bool = False,
                      triggered_by: str = "automatic", fallback_state: Any = None
                      ) -> UnwindReport:
        return await aunwind(self.journal, run_id, self.spec, cause,
                             include_in_doubt=include_in_doubt, triggered_by=triggered_by,
                             fallback_state=fallback_state, on_event=self.on_event,
                             check=lambda: self.check_lease(run_id))
