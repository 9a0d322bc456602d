"""The ``Journal`` protocol and ``InMemoryJournal``, its in-process implementation.

A journal is StateGuard's memory of a run: which steps started and finished, which compensations
ran and how every attempt went, which approvals are pending. The web app implements it over the
Django ORM; ``SqliteJournal`` keeps it in a file that several processes share.

Rules every implementation keeps (the saga's guarantees rest on them):
- ``compensation_attempt`` is durable when it returns, so an unwind that is run again (after a
  crash, or by an operator) skips compensations that already succeeded;
- ``lock_acquire`` is atomic: two owners never both hold a run's lock, and ``lock_renew`` never
  takes back a lock that was released or taken over;
- ``approval_decide`` is atomic: only one decision turns a pending approval into a decided one.

``SqliteJournal`` and ``PostgresJournal`` (``stateguard.postgres_journal``, the ``postgres``
extra) are the shipped journals that several processes share.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from stateguard.effects import EffectRecord, settled_status
from stateguard.lifecycle import FINISHED, LIVE, check_change
from stateguard.records import (
    EFFECT_STATUSES,
    ApprovalRecord,
    ApprovalStatus,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    ErrorInfo,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
)
from stateguard.stops import StopRequest


@runtime_checkable
class Journal(Protocol):
    def run_begin(self, run_id: str) -> RunRecord:
        """Return the run, creating it (status ``running``) if it is new."""

    def run_get(self, run_id: str) -> RunRecord | None: ...

    def run_set_status(self, run_id: str, status: RunStatus,
                       error: ErrorInfo | None = None) -> None: ...

    def lock_acquire(self, run_id: str, owner: str, ttl: float) -> bool:
        """Take (or, for the same owner, extend) the run's lock; False if someone else holds it.

        Creates the run (status ``running``) if it is new."""

    def lock_renew(self, run_id: str, owner: str, ttl: float) -> bool:
        """Extend a lock ``owner`` still holds; False if it was released or taken over (a
        renewal must never take a lock back: the run may have been recovered meanwhile)."""

    def lock_release(self, run_id: str, owner: str) -> None: ...

    def step_start(self, run_id: str, step_id: str, node: str,
                   tags: tuple[str, ...] = (), *, kind: str = "compensatable"
                   ) -> tuple[StepRecord, StepStatus | None]:
        """Record that a step's body is about to run, and its kind (``stateguard.kinds``);
        return it and its previous status, if any. (The guard passes ``kind`` only for a step
        that is not compensatable: a journal written before kinds existed keeps working for
        guards that declare none.)"""

    def step_finish(self, run_id: str, step_id: str, status: StepStatus, *, update: Any = None,
                    state_after: Any = None, error: ErrorInfo | None = None) -> None:
        """Record a step's outcome; steps with an effect get the next completion number."""

    def steps(self, run_id: str) -> list[StepRecord]: ...

    def compensation_begin(self, record: CompensationRecord) -> CompensationRecord:
        """Return the step's compensation record, creating it from ``record`` if there is none."""

    def compensation_attempt(self, run_id: str, step_id: str, attempt: AttemptRecord,
                             status: CompensationStatus, *, retry_at: float | None = None
                             ) -> None:
        """Journal one attempt and the compensation's status, and for ``waiting`` its next
        round's time. (The unwind passes ``retry_at`` only then: a journal written before it
        existed keeps working for policies without ``RetryLater``.)"""

    def compensations(self, run_id: str) -> list[CompensationRecord]: ...

    def approval_request(self, record: ApprovalRecord) -> ApprovalRecord:
        """Return the step's approval, creating it (pending) from ``record`` if there is none."""

    def approval_decide(self, run_id: str, step_id: str, status: ApprovalStatus, *,
                        by: str | None, reason: str = "") -> bool:
        """Decide a pending approval; False if it was not pending (someone else decided first)."""

    def approvals(self, run_id: str) -> list[ApprovalRecord]: ...


@runtime_checkable
class TurnJournal(Protocol):
    """A journal that keeps a thread's turns apart (optional; ``InMemoryJournal`` and
    ``SqliteJournal`` do).

    LangGraph's chat pattern invokes one thread once per user turn. Each turn is a saga of its
    own: when a later turn fails, only its steps are undone, never those of a turn that
    finished. ``step_start`` stamps each step with the run's current turn (``StepRecord.turn``).
    Without this, a thread runs one saga only: a second turn is refused."""

    def run_next_turn(self, run_id: str) -> RunRecord:
        """Start the run's next turn, atomically: ``turn + 1``, status ``running``, no
        error; return the run as it now is."""


@runtime_checkable
class PurgingJournal(Protocol):
    """A journal that can forget a run (optional; ``InMemoryJournal`` and ``SqliteJournal``
    can): ``StateGuardCheckpointer.delete_thread`` purges the thread's run with its checkpoints.
    """

    def run_purge(self, run_id: str) -> None:
        """Forget the run: its steps, compensations, approvals and effects."""


@runtime_checkable
class StepLookupJournal(Protocol):
    """A journal that reads one step by its id (optional: ``InMemoryJournal``,
    ``SqliteJournal`` and the web app's do). ``find_step`` uses it; a journal without it
    still works, by a scan of ``steps()``.

    Before each tool call a guarded ``ToolNode`` looks up the call's own step, to answer a
    call LangGraph runs again from the journal: ``steps()`` there read every step of the run,
    O(n^2) rows over a run of n calls."""

    def step_get(self, run_id: str, step_id: str) -> StepRecord | None:
        """The step as ``steps()`` would give it; ``None`` if the run has no such step."""


@runtime_checkable
class AbandonedRunsJournal(Protocol):
    """A journal that lists the runs no process is driving (optional: ``InMemoryJournal``,
    ``SqliteJournal`` and ``PostgresJournal`` do): ``guard.sweep`` recovers them.

    A run is abandoned when it is live (running or compensating) and
    - its lock expired: its holder died, or stalled for longer than its lease;
    - or no one holds its lock and it has not changed for ``idle`` seconds (its process was
      cancelled, or let go of it on an error that escaped the guard); but a run whose
      compensations wait for their next round (``RetryLater``) is abandoned only once one of
      them is due (its ``retry_at`` came).

    Such a journal keeps ``RunRecord.fencing_token`` (one more on every new holder of the
    lock): a sweeper that takes the lock after listing a run knows from it whether anyone
    else held the run in between, and leaves it alone if so."""

    def runs_abandoned(self, *, idle: float, limit: int) -> list[RunRecord]:
        """At most ``limit`` abandoned runs, longest abandoned first."""


@runtime_checkable
class StopJournal(Protocol):
    """A journal that carries operators' requests to stop a run to the process running it
    (optional: the web app's does; ``stateguard.stops``). The guard asks it right after it
    takes a run's lease and at each heartbeat of the lease, and tells it when it has carried a
    request out. A journal may answer the first from what the statement that took the lease
    read (the web app's does: no round trip more per run)."""

    def run_stop_requested(self, run_id: str) -> StopRequest | None:
        """The stop asked of the run and not carried out yet, if any."""

    def run_stop_done(self, run_id: str, stop: StopRequest, status: RunStatus) -> None:
        """``stop`` was carried out: the run is ``status`` now (unwound, or held); forget it."""


def find_step(journal: Journal, run_id: str, step_id: str) -> StepRecord | None:
    """One step of the run, read on its own when the journal can (``StepLookupJournal``)."""
    # getattr, not isinstance: a runtime protocol check costs ~5 us, and this runs before
    # every tool call.
    step_get: Callable[[str, str], StepRecord | None] | None = getattr(journal, "step_get", None)
    if step_get is not None:
        return step_get(run_id, step_id)
    return next((s for s in journal.steps(run_id) if s.step_id == step_id), None)


def turn_steps(journal: Journal, run_id: str, run: RunRecord | None = None) -> list[StepRecord]:
    """The steps of the run's current turn (all of them for a journal without turns)."""
    steps = journal.steps(run_id)
    if run is None:
        run = journal.run_get(run_id)
    turn = run.turn if run is not None else 1
    return [s for s in steps if s.turn == turn]




class InMemoryJournal:
    """A thread-safe journal held in this process; the default, and the test double.

    It stores the objects it is given (no copies on the hot path), so it costs next to nothing per
    step; readers get copies.

    While a run is live it keeps every step's update and the state after it; once it finishes
    (succeeded or compensated) only what its compensations could still need (see
    ``_compact``). A guard lives as long as the server, so it keeps the ``max_finished_runs``
    most recently finished runs and forgets older ones, with their effects (``None``: keep
    every run). A run that is running, paused, failed or needs attention is never forgotten this
    way. ``run_purge`` (what ``delete_thread`` calls) forgets one at once. A journal shared by
    processes, or one that must keep history, is ``SqliteJournal`` or the web app's.
    """

    def __init__(self, *, max_finished_runs: int | None = 10_000,
                 undoable: Callable[[StepRecord], bool] | None = None) -> None:
        if max_finished_runs is not None and (
                not isinstance(max_finished_runs, int) or max_finished_runs < 1):
            raise ValueError("max_finished_runs must be a positive int, or None to keep all")
        if undoable is not None and not callable(undoable):
            raise ValueError("undoable must be a function of a step, or None")
        self.max_finished_runs = max_finished_runs
        self.undoable = undoable
        self._finished: OrderedDict[str, None] = OrderedDict()  # oldest finished first
        self._lock = threading.Lock()
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, dict[str, StepRecord]] = {}
        self._done_seq: dict[str, int] = {}
        self._comps: dict[str, dict[str, CompensationRecord]] = {}
        self._approvals: dict[str, dict[str, ApprovalRecord]] = {}
        self._effects: dict[tuple[str, str], EffectRecord] = {}  # by (provider, external_id)

    def run_begin(self, run_id: str) -> RunRecord:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = RunRecord(run_id)
            return copy.copy(run)

    def run_get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            run = self._runs.get(run_id)
            return copy.copy(run) if run else None

    def run_set_status(self, run_id: str, status: RunStatus,
                       error: ErrorInfo | None = None) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                run = self._runs[run_id] = RunRecord(run_id, status)
            check_change(run.status, status, run=run_id)
            run.status = status
            if error is not None or status in (RunStatus.RUNNING, RunStatus.SUCCEEDED):
                run.error = error
            run.updated_at = time.time()
            self._note_status(run_id, status)

    def _note_status(self, run_id: str, status: RunStatus) -> None:
        """Keep the finished runs in the order they finished, and forget the oldest beyond
        the cap. Called with the lock held."""
        if status not in FINISHED:  # a finished run owes nothing: the oldest may be forgotten
            self._finished.pop(run_id, None)
            return
        self._compact(run_id)
        self._finished[run_id] = None
        self._finished.move_to_end(run_id)
        while self.max_finished_runs is not None and len(self._finished) > self.max_finished_runs:
            self._forget(next(iter(self._finished)))

    def _compact(self, run_id: str) -> None:
        """A finished run keeps its outcome, not its states: the state after each step is
        dropped; and when ``undoable`` says
        which steps a compensation would undo (the journal a guard makes for itself), so is
        the update of every other step. What a later compensation reads is kept: its step's
        update (``ctx.step_result``, ``ctx.tool_call``); for the state it is given, the thread's
        own (the saver's) stands in. Called with the lock held."""
        undoable = self.undoable
        for step in self._steps.get(run_id, {}).values():
            step.state_after = None
            if undoable is not None and not undoable(step):
                step.update = None

    def run_purge(self, run_id: str) -> None:
        with self._lock:
            self._forget(run_id)

    def _forget(self, run_id: str) -> None:
        for held in (self._runs, self._steps, self._done_seq, self._comps, self._approvals,
                     self._finished):
            held.pop(run_id, None)
        for key in [k for k, e in self._effects.items() if e.run_id == run_id]:
            del self._effects[key]

    def run_next_turn(self, run_id: str) -> RunRecord:
        with self._lock:
            run = self._runs.setdefault(run_id, RunRecord(run_id))
            check_change(run.status, RunStatus.RUNNING, run=run_id)
            run.turn += 1
            run.status, run.error, run.updated_at = RunStatus.RUNNING, None, time.time()
            self._note_status(run_id, run.status)
            return copy.copy(run)

    def lock_acquire(self, run_id: str, owner: str, ttl: float) -> bool:
        now = time.time()
        with self._lock:
            run = self._runs.setdefault(run_id, RunRecord(run_id))
            if run.lock_owner not in (None, owner) and run.lock_expires > now:
                return False
            if run.lock_owner != owner:
                run.fencing_token += 1
            run.lock_owner, run.lock_expires = owner, now + ttl
            return True

    def lock_renew(self, run_id: str, owner: str, ttl: float) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.lock_owner != owner:
                return False
            run.lock_expires = time.time() + ttl
            return True

    def lock_release(self, run_id: str, owner: str) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and run.lock_owner == owner:
                # A live run let go of is abandoned once it stays unchanged (runs_abandoned).
                run.lock_owner, run.lock_expires, run.updated_at = None, 0.0, time.time()

    def runs_abandoned(self, *, idle: float, limit: int) -> list[RunRecord]:
        now = time.time()
        found: list[tuple[float, RunRecord]] = []
        with self._lock:
            for run in self._runs.values():
                if run.status not in LIVE:
                    continue
                if run.lock_owner is not None:
                    if run.lock_expires < now:
                        found.append((run.lock_expires, run))
                    continue
                waits = [c.retry_at or 0.0 for c in self._comps.get(run.run_id, {}).values()
                         if c.status == CompensationStatus.WAITING]
                if waits:
                    if min(waits) <= now:
                        found.append((min(waits), run))
                elif run.updated_at < now - idle:
                    found.append((run.updated_at, run))
            found.sort(key=lambda since: since[0])
            return [copy.copy(run) for _, run in found[:limit]]

    def step_start(self, run_id: str, step_id: str, node: str,
                   tags: tuple[str, ...] = (), *, kind: str = "compensatable"
                   ) -> tuple[StepRecord, StepStatus | None]:
        with self._lock:
            steps = self._steps.setdefault(run_id, {})
            prev = steps.get(step_id)
            run = self._runs.get(run_id)
            step = StepRecord(run_id, step_id, node, tags,
                              attempt=prev.attempt + 1 if prev else 1,
                              turn=run.turn if run is not None else 1, kind=str(kind))
            steps[step_id] = step
            return step, prev.status if prev else None

    def step_finish(self, run_id: str, step_id: str, status: StepStatus, *, update: Any = None,
                    state_after: Any = None, error: ErrorInfo | None = None) -> None:
        with self._lock:
            step = self._steps[run_id][step_id]
            step.status, step.update, step.state_after, step.error = (
                status, update, state_after, error)
            step.finished_at = time.time()
            if status in EFFECT_STATUSES:
                seq = self._done_seq[run_id] = self._done_seq.get(run_id, 0) + 1
                step.done_seq = seq

    def steps(self, run_id: str) -> list[StepRecord]:
        with self._lock:
            return [copy.copy(s) for s in self._steps.get(run_id, {}).values()]

    def step_get(self, run_id: str, step_id: str) -> StepRecord | None:
        with self._lock:
            step = self._steps.get(run_id, {}).get(step_id)
            return copy.copy(step) if step is not None else None

    def compensation_begin(self, record: CompensationRecord) -> CompensationRecord:
        with self._lock:
            comps = self._comps.setdefault(record.run_id, {})
            existing = comps.setdefault(record.step_id, record)
            return copy.deepcopy(existing)

    def compensation_attempt(self, run_id: str, step_id: str, attempt: AttemptRecord,
                             status: CompensationStatus, *, retry_at: float | None = None
                             ) -> None:
        with self._lock:
            record = self._comps[run_id][step_id]
            record.attempts.append(attempt)
            record.status, record.retry_at = status, retry_at

    def compensations(self, run_id: str) -> list[CompensationRecord]:
        with self._lock:
            return [copy.deepcopy(c) for c in self._comps.get(run_id, {}).values()]

    def approval_request(self, record: ApprovalRecord) -> ApprovalRecord:
        with self._lock:
            approvals = self._approvals.setdefault(record.run_id, {})
            return copy.copy(approvals.setdefault(record.step_id, record))

    def approval_decide(self, run_id: str, step_id: str, status: ApprovalStatus, *,
                        by: str | None, reason: str = "") -> bool:
        with self._lock:
            approval = self._approvals.get(run_id, {}).get(step_id)
            if approval is None or approval.status != ApprovalStatus.PENDING:
                return False
            approval.status, approval.decided_by, approval.reason = status, by, reason
            approval.decided_at = time.time()
            return True

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        with self._lock:
            return [copy.copy(a) for a in self._approvals.get(run_id, {}).values()]

    def effect_record(self, record: EffectRecord) -> EffectRecord:
        with self._lock:
            stored = self._effects.setdefault(record.key, record)
            # The effect it undoes (a refund's charge) may be known already, and so may the
            # effects that undo it (recorded first by a reconciliation): settle both.
            provider, undone = stored.effect.provider, stored.effect.undoes
            for effect in (self._effects.get((provider, undone)) if undone else None, stored):
                if effect is not None:
                    effect.status = settled_status(effect.effect, (
                        e.effect for e in self._effects.values()
                        if e.effect.provider == provider
                        and e.effect.undoes == effect.effect.external_id))
            return copy.copy(stored)

    def effects(self, run_id: str) -> list[EffectRecord]:
        with self._lock:
            return [copy.copy(e) for e in self._effects.values() if e.run_id == run_id]
