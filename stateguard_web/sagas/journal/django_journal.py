"""``DjangoJournal``: the core's ``Journal`` protocol over the saga models.

Fencing: when this journal takes a run's lease it remembers the run's fencing token, and every
later write for that run first bumps the run row *only if the token is unchanged*, in the same
transaction as the write. A worker whose lease expired and was taken over (the token grew)
gets ``LeaseLost`` instead of writing; the row lock also serializes a run's writes. When a
lease may be taken over is ``leases``' to say: the holder's process gone (its ``ProcessLock``
free), or the lease expired, by the database's clock.

With ``defer_steps=True`` (PostgreSQL, with ``JournalingPostgresSaver``) the step rows of a run's
first run (leased while pending) are written with LangGraph's checkpoint writes instead of on
their own (see ``step_rows``); any other use of the run writes them first, so that readers in
this process never see the journal behind.

Except the start of a step nested inside a node's task: a ``@task`` call (tagged
``stateguard:task``, ``stateguard.functional``) or a tool call (tagged ``stateguard:tool_call``,
``stateguard.tools``). A node's row may wait because LangGraph's last checkpoint lists the node
as a pending task until its writes commit: a crash inside it is found again (the runner
journals it in doubt). A nested call is no task of the checkpoint (an ``@entrypoint`` is one
node, and its tasks run inside it; a ``ToolNode``'s calls run inside its ``tools`` task, whose
in-doubt row names the node, which has no compensation, not the tool that charged): LangGraph
writes nothing between the call's start and its effect, and after a crash nothing would say it
ran. So its start is written at once, in the one statement that also carries every row and
status waiting before it (one round trip per call, fenced: a worker that lost its lease never
runs the body). Its outcome still waits: it travels with LangGraph's write of the task's result
(the same transaction, so the journal says "succeeded" no later than LangGraph has the result
to replay), or with the next call's start, whichever comes first. A process that dies between
the two leaves the call "started": in doubt, compensated only by an ``in_doubt_safe``
compensation (else the run needs attention) and run again on resume, as LangGraph, which has
no saved result either, would run it.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Subquery
from django.utils import timezone

from stateguard import ErrorInfo, RunLocked, RunNotFound
from stateguard.effects import Effect as CoreEffect
from stateguard.effects import EffectRecord, EffectStatus, settled_status
from stateguard.functional import TASK_TAG
from stateguard.lifecycle import CHANGES, Action, check_change
from stateguard.records import (
    EFFECT_STATUSES,
    ApprovalRecord,
    ApprovalStatus,
    AttemptRecord,
    CompensationRecord,
    CompensationStatus,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
    json_default,
)
from stateguard.stops import StopRequest
from stateguard.tool_calls import TOOL_TAG
from stateguard_web.sagas import events, signals
from stateguard_web.sagas.journal.leases import NOW_PLUS, TAKEN_OVER
from stateguard_web.sagas.journal.process_lock import ProcessLock
from stateguard_web.sagas.journal.step_rows import FENCE_SQLSTATE, JOURNAL, StepBuffer, Taken
from stateguard_web.sagas.models import (
    Approval,
    AuditEvent,
    Compensation,
    CompensationAttempt,
    Effect,
    Run,
    Step,
)

_RUN, _STEP = Run._meta.db_table, Step._meta.db_table
# Steps that run inside a node's task, not as tasks of the checkpoint (a ``@task`` call, a tool
# call): their start is written at once, never deferred (see the module's docstring).
_NESTED = frozenset({TASK_TAG, TOOL_TAG})
# ``fence``: the run row, if its fencing token is still ours (or we hold no lease). On
# PostgreSQL the row is locked FOR SHARE, so a takeover committing meanwhile makes the check
# wait and fail instead of passing on a stale snapshot; SQLite runs one writer at a time.
_SHARE = " FOR SHARE" if connection.vendor == "postgresql" else ""
# Our fencing token, or NULL (no lease). Typed: PostgreSQL binds the values apart from the
# text (settings.py) and cannot tell the type of a bare NULL.
_OURS = "(CAST(%s AS bigint) IS NULL OR fencing_token = %s)"
_FENCE = f"SELECT id FROM {_RUN} WHERE code = %s AND {_OURS}{_SHARE}"
# Insert the step, or restart it: prev_status keeps the status it had before this start.
_STEP_START = f"""
INSERT INTO {_STEP} (run_id, step_id, node, tags, status, attempt, started_at, kind)
SELECT id, %s, %s, %s, 'started', 1, %s, %s FROM {_RUN}
WHERE code = %s AND {_OURS}{_SHARE}
ON CONFLICT (run_id, step_id) DO UPDATE SET
    prev_status = {_STEP}.status, status = 'started', attempt = {_STEP}.attempt + 1,
    node = excluded.node, tags = excluded.tags, started_at = excluded.started_at,
    kind = excluded.kind,
    finished_at = NULL, done_seq = NULL, "update" = NULL, state_after = NULL, error = NULL
RETURNING attempt, prev_status"""
# Steps with an effect get the next completion number of their run.
_STEP_FINISH = f"""
UPDATE {_STEP} SET status = %s, finished_at = %s, "update" = %s, state_after = %s, error = %s,
    done_seq = CASE WHEN %s THEN (SELECT COALESCE(MAX(s.done_seq), 0) + 1 FROM {_STEP} s
                                  WHERE s.run_id = {_STEP}.run_id) END
WHERE step_id = %s AND run_id = ({_FENCE})"""
_RUN_COLUMNS = "code, status, error, lease_owner, lease_expires_at, created_at, updated_at"
# A write that may be lost if the *database* crashes (it commits without waiting for the disk):
# for the lease and the final "succeeded" only. A lost lease write leaves the worker fenced out
# at its next checkpoint write (which, waiting for the disk, makes the lease durable first);
# a lost "succeeded" leaves a running run whose graph finished, which recovery settles as
# succeeded. Each saves a disk flush per run.
_NO_FLUSH = (" FROM (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush"
             if connection.vendor == "postgresql" else "")
# Take or renew the lease, naming this process's lock; a new holder gets the next fencing
# token. Taken from another owner only as ``leases.TAKEN_OVER`` allows (its parameter: the grace).
# With the run, the operator's request left on it: a terminate the guard asks about next
# (``run_stop_requested``), at no round trip more per run.
_LOCK = f"""
UPDATE {_RUN} SET lease_owner = %s, lease_expires_at = {NOW_PLUS}, lease_lock = %s,
    fencing_token = CASE WHEN lease_owner = %s THEN fencing_token ELSE fencing_token + 1 END
{_NO_FLUSH}
WHERE code = %s AND (lease_owner = '' OR lease_owner = %s OR {TAKEN_OVER})
RETURNING fencing_token, {_RUN_COLUMNS}, request"""
_REQUEST = f"SELECT request FROM {_RUN} WHERE code = %s"
_RENEW = f"""
UPDATE {_RUN} SET lease_expires_at = {NOW_PLUS}, lease_lock = %s
WHERE code = %s AND lease_owner = %s AND fencing_token = %s"""
_GET = f"SELECT {_RUN_COLUMNS} FROM {_RUN} WHERE code = %s"
# ``release``: a succeeded run is done, so the write that says so also gives up its lease.
# Only from a status the state machine allows to go to the new one (lifecycle.CHANGES): the
# same statement checks it, so no read comes before the write.
_SET_STATUS = f"""
UPDATE {_RUN} SET status = %s, updated_at = %s, error = CASE WHEN %s THEN %s ELSE error END,
    lease_owner = CASE WHEN %s THEN '' ELSE lease_owner END,
    lease_expires_at = CASE WHEN %s THEN NULL ELSE lease_expires_at END
WHERE code = %s AND {_OURS} AND status IN ({{sources}})"""


def _set_status_sql(status: RunStatus) -> str:
    sources = sorted({status, *(old for old, new in CHANGES.items() if status in new)})
    sql = _SET_STATUS.format(sources=", ".join(f"'{s.value}'" for s in sources))
    return sql.replace("\nWHERE", f"\n{_NO_FLUSH}\nWHERE") if status == RunStatus.SUCCEEDED \
        else sql


_SET_STATUS_TO = {status: _set_status_sql(status) for status in RunStatus}
_RELEASE = f"""
UPDATE {_RUN} SET lease_owner = '', lease_expires_at = NULL WHERE code = %s AND lease_owner = %s"""


# Statuses that tell operators a run waits for them (notifications/services.py).
_NOTIFY = frozenset({RunStatus.PAUSED, RunStatus.NEEDS_ATTENTION})


class LeaseLost(RunLocked):
    """This worker's lease on the run was taken over: it must not write anything more."""


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


def _aware(value: Any) -> Any:
    """A datetime as the database returned it, made aware (SQLite returns text, naive UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def _ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def _json(value: Any) -> Any:
    """Values the JSON column can store (states may hold pydantic models and the like)."""
    return None if value is None else json.loads(json.dumps(value, default=json_default))


def _error_json(error: ErrorInfo | None) -> dict[str, str] | None:
    return error.to_dict() if error else None


def _stop(request: Any) -> StopRequest | None:
    """The terminate an operator left on the run (``runs.services.run_terminate``), if the
    request column (JSON, as the database returns it) holds one."""
    if isinstance(request, str):  # SQLite, and psycopg's text for raw queries
        request = json.loads(request)
    if not isinstance(request, dict) or request.get("action") != Action.TERMINATE:
        return None
    return StopRequest(request.get("then", "unwind"), request.get("by") or None,
                       request.get("reason", ""), id=str(request["id"]))


def is_fenced_out(exc: BaseException) -> bool:
    """Whether a database error is the fence (``sagas_fence()``, in ``sagas_journal()`` or the
    checkpoint trigger) refusing a worker that lost its lease."""
    cause = exc if getattr(exc, "sqlstate", None) else exc.__cause__
    return getattr(cause, "sqlstate", None) == FENCE_SQLSTATE


class DjangoJournal:
    """``process_lock``: this process's lock, named by every lease it takes, so that a lease
    of a process that died is taken over at once; ``grace``: seconds past its expiry that a
    lease whose holder lives is kept (``leases``)."""

    def __init__(self, *, defer_steps: bool = False, process_lock: ProcessLock | None = None,
                 grace: float = 60.0) -> None:
        self.process_lock = process_lock
        self.grace = float(grace)
        self._fences: dict[str, int] = {}  # run id -> fencing token held by this journal
        self.defers_steps = defer_steps
        self._buffer = StepBuffer()
        # Per run: held from taking its pending rows until the write that carries them has
        # committed or given them back (``rows_in_order``).
        self._in_order: dict[str, threading.RLock] = {}
        self._in_order_guard = threading.Lock()
        # Runs whose lease this journal took while they were pending: their first run, where
        # every step is new and LangGraph's checkpoints hold the whole history. Only there do
        # step rows and the move to running wait for the checkpoint writes; a run resumed
        # (approved, retried, recovered) writes them at once, so that a crash leaves it
        # "running" for the sweeper, with its re-run step in doubt.
        self._fresh: set[str] = set()
        # The run as the statement that took its lease found it, for the read that follows
        # (the runner checks the status right after): dropped at the first read or write.
        self._locked: dict[str, RunRecord] = {}
        self._released: set[str] = set()  # leases given up by the write that ended the run
        # The terminate found on the run by the statement that took its lease (None: none),
        # for the guard's question that follows (``run_stop_requested``): dropped when read.
        self._stop_seen: dict[str, StopRequest | None] = {}

    # -- deferred step rows -----------------------------------------------------------------
    def fencing_token(self, run_id: str) -> int | None:
        """The run's fencing token, if this journal holds its lease."""
        return self._fences.get(run_id)

    def take_pending(self, run_id: str, *, fence: bool = True
                     ) -> tuple[tuple[str, tuple[Any, ...]], Taken | None] | None:
        """What the checkpoint saver sends with its next write for this run, if this journal
        holds the run's lease: the fence, and the status and step rows not written yet (hand
        them back with ``give_back`` if that write fails). ``fence=False``: the write is fenced
        otherwise (or needs no fence), so nothing unless there are rows or a status."""
        token = self._fences.get(run_id)
        if token is None:
            return None
        taken = self._buffer.take(run_id)
        if taken is None and not fence:
            return None
        params = taken.params() if taken else (None, None)
        return (JOURNAL, (uuid.UUID(run_id), token, *params)), taken

    def give_back(self, run_id: str, taken: Taken) -> None:
        self._buffer.give_back(run_id, taken)

    @contextmanager
    def rows_in_order(self, run_id: str) -> Iterator[None]:
        """Hold around ``take_pending`` and the write that carries what it took, until that
        write committed (or gave it back): the run's rows then commit in the order taken.

        The saver's writes go on pool connections and flushes on each thread's own: two
        writes that took a step's start (taken while it ran) and then its finish could
        otherwise commit finish first, and the start, to ``sagas_journal`` a re-run, would set
        the step that succeeded back to "started" (attempt 2), its compensation skipped as in
        doubt. A flush inside a transaction of the caller's commits later, with it: none
        does. Reentrant: a write may flush on its own thread."""
        with self._in_order_guard:
            lock = self._in_order.setdefault(run_id, threading.RLock())
        with lock:
            yield

    def holds(self, run_id: str) -> bool:
        """Whether the run has a status or step rows not written yet (live updates about them
        wait for the write that carries them: ``events.watch_journal``)."""
        return self.defers_steps and self._buffer.holds(run_id)

    def _flush(self, run_id: str) -> None:
        """Write the run's pending status and step rows now, on this thread's connection."""
        if not self.defers_steps:
            return
        with self.rows_in_order(run_id):
            pending = self.take_pending(run_id, fence=False)
            if pending is None:
                return
            statement, taken = pending
            try:
                with connection.cursor() as cursor:
                    cursor.execute(*statement)
            except DatabaseError as exc:
                if is_fenced_out(exc):
                    raise LeaseLost(run_id) from exc
                self.give_back(run_id, taken)
                raise
        if taken is not None:
            events.committed()  # autocommit: written

    # -- helpers ----------------------------------------------------------------------------
    @contextmanager
    def _write(self, run_id: str) -> Iterator[int]:
        """A transaction holding the run's row lock, fenced if we hold its lease."""
        with transaction.atomic():
            token = self._fences.get(run_id)
            runs = Run.objects.filter(code=run_id)
            if token is not None:
                if not runs.filter(fencing_token=token).update(updated_at=timezone.now()):
                    raise LeaseLost(run_id)
                pk = runs.values_list("pk", flat=True).get()
            else:
                pk = runs.select_for_update().values_list("pk", flat=True).get()
            yield pk

    def _fence(self, run_id: str) -> tuple[Any, int | None]:
        """The run's code as the database stores it, and our fencing token (None: unfenced)."""
        code = Run._meta.get_field("code").get_db_prep_value(uuid.UUID(run_id), connection)
        return code, self._fences.get(run_id)

    def _refused(self, run_id: str, token: int | None, status: RunStatus | None = None
                 ) -> None:
        """Why a write that names the run's fencing token (and, for ``status``, its old
        status) changed nothing: the lease was lost, the run is not there, or the state
        machine does not allow the change."""
        if status is not None:
            row = Run.objects.filter(code=run_id).values_list("status", "fencing_token").first()
            if row is not None and (token is None or row[1] == token):
                check_change(row[0], status, run=run_id)  # raises InvalidRunState
        if token is not None:
            raise LeaseLost(run_id)
        raise RunNotFound(run_id)

    # -- runs -------------------------------------------------------------------------------
    def run_begin(self, run_id: str) -> RunRecord:
        run, _ = Run.objects.get_or_create(code=run_id, defaults={"agent": "adhoc",
                                                                  "status": RunStatus.RUNNING})
        return self._run_record(tuple(getattr(run, c) for c in _RUN_COLUMNS.split(", ")))

    def run_get(self, run_id: str) -> RunRecord | None:
        locked = self._locked.pop(run_id, None)
        if locked is not None:
            return locked
        with connection.cursor() as cursor:
            cursor.execute(_GET, [self._fence(run_id)[0]])
            row = cursor.fetchone()
        return self._run_record(row) if row else None

    @staticmethod
    def _run_record(row: tuple[Any, ...]) -> RunRecord:
        """A record from the columns of ``_RUN_COLUMNS``, as the database returns them."""
        code, status, error, owner, expires, created, updated = row
        if isinstance(error, str):  # SQLite returns JSON as text
            error = json.loads(error)
        return RunRecord(str(code if isinstance(code, uuid.UUID) else uuid.UUID(code)),
                         RunStatus(status), ErrorInfo.from_dict(error), owner or None,
                         _ts(_aware(expires)) or 0.0, _aware(created).timestamp(),
                         _aware(updated).timestamp())

    def run_set_status(self, run_id: str, status: RunStatus,
                       error: ErrorInfo | None = None) -> None:
        self._locked.pop(run_id, None)
        code, token = self._fence(run_id)
        if status == RunStatus.RUNNING and error is None and run_id in self._fresh:
            self._buffer.set_status(run_id, status)  # written with the first checkpoint
            return
        self._buffer.drop_status(run_id)  # this status replaces it
        self._flush(run_id)
        field = Run._meta.get_field
        set_error = error is not None or status in (RunStatus.RUNNING, RunStatus.SUCCEEDED)
        release = token is not None and status == RunStatus.SUCCEEDED
        with connection.cursor() as cursor:
            cursor.execute(_SET_STATUS_TO[status], [
                status.value, field("updated_at").get_db_prep_value(timezone.now(), connection),
                set_error, None if error is None else field("error").get_db_prep_value(
                    _error_json(error), connection),
                release, release, code, token, token])
            if cursor.rowcount == 0:
                self._refused(run_id, token, status)
        if release:
            self._fences.pop(run_id, None)
            self._released.add(run_id)
        if status in _NOTIFY:  # a run that waits for an operator: rare, never once per step
            signals.run_waits.send(sender=Run, run_code=run_id, status=status)

    def _lock_key(self, *, check: bool = False) -> int | None:
        return None if self.process_lock is None else self.process_lock.key(check=check)

    def lock_acquire(self, run_id: str, owner: str, ttl: float) -> bool:
        code = Run._meta.get_field("code").get_db_prep_value(uuid.UUID(run_id), connection)
        key = self._lock_key()
        for _ in range(2):
            with connection.cursor() as cursor:
                cursor.execute(_LOCK, [owner, float(ttl), key, owner, code, owner, self.grace])
                row = cursor.fetchone()
            if row is not None:
                self._released.discard(run_id)
                self._fences[run_id] = row[0]
                self._locked[run_id] = self._run_record(row[1:-1])
                self._stop_seen[run_id] = _stop(row[-1])
                if self.defers_steps and self._locked[run_id].status == RunStatus.PENDING:
                    self._fresh.add(run_id)
                return True
            _, created = Run.objects.get_or_create(code=run_id, defaults={"agent": "adhoc"})
            if not created:
                return False
        return False

    def lock_renew(self, run_id: str, owner: str, ttl: float) -> bool:
        # Called from the heartbeat thread, whose connection a database restart may have
        # broken: reconnect rather than lose every lease of this worker.
        connection.close_if_unusable_or_obsolete()
        token = self._fences.get(run_id)
        if token is None:
            return False
        # Checks that the process lock still lives: after a database restart the old one is
        # free, and a lease naming it would be taken over at the next sweep.
        key = self._lock_key(check=True)
        code = Run._meta.get_field("code").get_db_prep_value(uuid.UUID(run_id), connection)
        with connection.cursor() as cursor:
            cursor.execute(_RENEW, [float(ttl), key, code, owner, token])
            return bool(cursor.rowcount)

    # -- operators' stops (stateguard.stops) -----------------------------------------------
    def run_stop_requested(self, run_id: str) -> StopRequest | None:
        if run_id in self._stop_seen:  # read by the statement that took the lease just now
            return self._stop_seen.pop(run_id)
        with connection.cursor() as cursor:
            cursor.execute(_REQUEST, [self._fence(run_id)[0]])
            row = cursor.fetchone()
        return _stop(row[0]) if row else None

    def run_stop_done(self, run_id: str, stop: StopRequest, status: RunStatus) -> None:
        """The operator's terminate was carried out: clear it from the run (unless another
        request replaced it meanwhile), audited with what became of the run."""
        with transaction.atomic():
            cleared = Run.objects.filter(code=run_id, request__id=stop.id).update(
                request=None, requested_at=None)
            run = Run.objects.filter(code=run_id).values_list("pk", flat=True).first()
            if run is not None:
                AuditEvent.objects.create(run_id=run, actor="worker", action="run.terminated",
                                          data={"then": stop.then, "requested_by": stop.by,
                                                "status": str(status),
                                                **({"reason": stop.reason} if stop.reason
                                                   else {})})
        if cleared:  # live pages say the request is no longer waiting (and re-read the run)
            events.publish_change(run_id, "run.request", action=None, done="terminate",
                                  by=stop.by)

    def lock_release(self, run_id: str, owner: str) -> None:
        try:
            self._flush(run_id)
        except LeaseLost:  # taken over: what this worker did not write is not its to write
            pass
        finally:
            self._buffer.forget(run_id)
            with self._in_order_guard:
                self._in_order.pop(run_id, None)  # nothing is left to write in order
            self._fresh.discard(run_id)
            self._locked.pop(run_id, None)
            self._stop_seen.pop(run_id, None)
            code = self._fence(run_id)[0]
            self._fences.pop(run_id, None)
        if run_id in self._released:  # the run's last status write let go of it already
            self._released.discard(run_id)
            return
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE, [code, owner])

    # -- steps ------------------------------------------------------------------------------
    # The two writes every step makes are single statements (the fence and the write at once,
    # in autocommit): a transaction of several round trips per write tripled the cost of a step.
    def step_start(self, run_id: str, step_id: str, node: str,
                   tags: tuple[str, ...] = (), *, kind: str = "compensatable"
                   ) -> tuple[StepRecord, StepStatus | None]:
        code, token = self._fence(run_id)
        now = timezone.now()
        if token is not None and run_id in self._fresh:
            self._buffer.start(run_id, step_id, node, tuple(tags), now, kind=str(kind))
            if not _NESTED.isdisjoint(tags):
                # A task or tool call: no checkpoint write comes between its start and its
                # effect (see the module's docstring), so its start goes now, with what waits.
                self._flush(run_id)
            return (StepRecord(run_id, step_id, node, tuple(tags), StepStatus.STARTED, 1,
                               now.timestamp(), kind=str(kind)), None)  # a first run
        field = Step._meta.get_field
        with connection.cursor() as cursor:
            cursor.execute(_STEP_START, [
                step_id, node, field("tags").get_db_prep_value(list(tags), connection),
                field("started_at").get_db_prep_value(now, connection), str(kind), code, token,
                token])
            row = cursor.fetchone()
        if row is None:
            self._refused(run_id, token)
        return (StepRecord(run_id, step_id, node, tuple(tags), StepStatus.STARTED, row[0],
                           now.timestamp(), kind=str(kind)),
                StepStatus(row[1]) if row[1] else None)

    def step_finish(self, run_id: str, step_id: str, status: StepStatus, *, update: Any = None,
                    state_after: Any = None, error: ErrorInfo | None = None) -> None:
        if self._buffer.finish(run_id, step_id, status, timezone.now(), update=update,
                               state_after=state_after, error=error):
            return
        code, token = self._fence(run_id)
        field = Step._meta.get_field
        with connection.cursor() as cursor:
            cursor.execute(_STEP_FINISH, [
                status.value, field("finished_at").get_db_prep_value(timezone.now(), connection),
                field("update").get_db_prep_value(_json(update), connection),
                field("state_after").get_db_prep_value(_json(state_after), connection),
                field("error").get_db_prep_value(_error_json(error), connection),
                status in EFFECT_STATUSES, step_id, code, token,
                token])
            if cursor.rowcount == 0:
                self._refused(run_id, token)

    def steps(self, run_id: str) -> list[StepRecord]:
        self._flush(run_id)
        return [_step_record(run_id, s)
                for s in Step.objects.filter(run__code=run_id).order_by("started_at")]

    def step_get(self, run_id: str, step_id: str) -> StepRecord | None:
        # Pending rows are written first, as steps() does; then one row by the (run, step_id)
        # unique constraint's index, both columns known before the scan (the run's id by its
        # code, in a subquery: a join let the planner scan that index for the step id alone).
        self._flush(run_id)
        run = Subquery(Run.objects.filter(code=run_id).order_by().values("pk"))
        try:
            return _step_record(run_id, Step.objects.get(run=run, step_id=step_id))
        except Step.DoesNotExist:
            return None

    # -- compensations ----------------------------------------------------------------------
    def compensation_begin(self, record: CompensationRecord) -> CompensationRecord:
        self._flush(record.run_id)
        with self._write(record.run_id) as pk:
            step = Step.objects.get(run_id=pk, step_id=record.step_id)
            Compensation.objects.get_or_create(step=step, defaults={
                "run_id": pk, "node": record.node, "idempotency_key": record.idempotency_key,
                "status": record.status.value, "triggered_by": record.triggered_by})
        return next(c for c in self.compensations(record.run_id)
                    if c.step_id == record.step_id)

    def compensation_attempt(self, run_id: str, step_id: str, attempt: AttemptRecord,
                             status: CompensationStatus, *, retry_at: float | None = None
                             ) -> None:
        with self._write(run_id) as pk:
            comp = Compensation.objects.get(run_id=pk, step__step_id=step_id)
            CompensationAttempt.objects.create(
                compensation=comp, number=attempt.number, started_at=_dt(attempt.started_at),
                finished_at=_dt(attempt.finished_at), ok=attempt.ok, result=attempt.result,
                error=_error_json(attempt.error))
            comp.status = status.value
            comp.retry_at = _dt(retry_at)  # a round's first attempt clears the last one's
            comp.save(update_fields=["status", "retry_at", "updated_at"])

    def compensations(self, run_id: str) -> list[CompensationRecord]:
        comps = (Compensation.objects.filter(run__code=run_id).select_related("step")
                 .prefetch_related("attempts"))
        return [CompensationRecord(
            run_id, c.step.step_id, c.node, c.idempotency_key, CompensationStatus(c.status),
            c.triggered_by,
            [AttemptRecord(a.number, a.started_at.timestamp(), a.finished_at.timestamp(), a.ok,
                           a.result, ErrorInfo.from_dict(a.error)) for a in c.attempts.all()],
            _ts(c.retry_at))
            for c in comps]

    # -- approvals --------------------------------------------------------------------------
    def approval_request(self, record: ApprovalRecord) -> ApprovalRecord:
        with self._write(record.run_id) as pk:
            Approval.objects.get_or_create(run_id=pk, step_id=record.step_id, defaults={
                "node": record.node, "payload": _json(record.payload),
                "requested_at": _dt(record.requested_at)})
        return next(a for a in self.approvals(record.run_id) if a.step_id == record.step_id)

    def approval_decide(self, run_id: str, step_id: str, status: ApprovalStatus, *,
                        by: str | None, reason: str = "") -> bool:
        with self._write(run_id) as pk:
            return bool(Approval.objects.filter(
                run_id=pk, step_id=step_id, status=Approval.Status.PENDING,
            ).update(status=status.value, decided_by=by or "", reason=reason,
                     decided_at=timezone.now()))

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        return [ApprovalRecord(run_id, a.step_id, a.node, a.payload, ApprovalStatus(a.status),
                               a.decided_by or None, a.reason, a.requested_at.timestamp(),
                               _ts(a.decided_at))
                for a in Approval.objects.filter(run__code=run_id).order_by("requested_at")]

    # -- effects ----------------------------------------------------------------------------
    # Not fenced: an effect happened whoever records it, and a worker that lost its lease has
    # still charged the card. Recording it is always right; the unique key makes it once.
    def effect_record(self, record: EffectRecord) -> EffectRecord:
        e = record.effect
        with transaction.atomic():
            run_pk = Run.objects.filter(code=record.run_id).values_list("pk", flat=True).get()
            try:
                with transaction.atomic():  # a savepoint: another recorder may have won
                    Effect.objects.create(
                        run_id=run_pk, step_id=record.step_id, node=record.node,
                        provider=e.provider, kind=e.kind, external_id=e.external_id,
                        amount=e.amount, currency=e.currency, idempotency_key=e.idempotency_key,
                        undoes=e.undoes, status=record.status.value,
                        recorded_at=_dt(record.recorded_at))
            except IntegrityError:
                pass
            stored = Effect.objects.get(provider=e.provider, external_id=e.external_id)
            for external_id in filter(None, (stored.undoes, stored.external_id)):
                _settle(e.provider, external_id)
            stored.refresh_from_db()
        return _effect_record(stored)

    def effects(self, run_id: str) -> list[EffectRecord]:
        return [_effect_record(e) for e in Effect.objects.filter(run__code=run_id)
                .select_related("run").order_by("recorded_at", "pk")]


def _step_record(run_id: str, s: Step) -> StepRecord:
    return StepRecord(run_id, s.step_id, s.node, tuple(s.tags), StepStatus(s.status), s.attempt,
                      s.started_at.timestamp(), _ts(s.finished_at), s.done_seq, s.update,
                      s.state_after, ErrorInfo.from_dict(s.error), kind=s.kind)


def _settle(provider: str, external_id: str) -> None:
    """Set an effect's status from the effects that undo it, under its row lock (two refunds
    recorded at once must both be counted)."""
    target = Effect.objects.select_for_update().filter(
        provider=provider, external_id=external_id).first()
    if target is None:
        return
    undoing = [_effect_record(u).effect
               for u in Effect.objects.filter(provider=provider, undoes=external_id)]
    status = settled_status(_effect_record(target).effect, undoing)
    if status != target.status:
        Effect.objects.filter(pk=target.pk).update(status=status.value)


def _effect_record(e: Effect) -> EffectRecord:
    return EffectRecord(str(e.run.code), e.step_id, e.node,
                        CoreEffect(e.provider, e.kind, e.external_id, e.amount, e.currency,
                                   e.idempotency_key, e.undoes),
                        EffectStatus(e.status), e.recorded_at.timestamp())
