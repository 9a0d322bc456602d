"""Celery tasks: thin, take ids, idempotent (safe with ``acks_late`` redelivery).

``run_execute`` backs off when another worker holds the run: that worker is running it, or the
sweeper hands the run to recovery once its lease expires. An operator's action on a locked run
(the pausing worker has not let go yet, or another action is running) is retried a little
later instead of being dropped. Whether an action still fits the run is decided by the guard,
under the run's lease (``stateguard.lifecycle``); when it no longer does, the audit trail says
so.

Task names are spelled out: they are the names these tasks had in ``stateguard_web.sagas.tasks``,
so that messages queued before the tasks moved still reach them after an upgrade.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import redis
from celery import Task, shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery

from stateguard import InvalidRunState, RunLocked, SagaAborted
from stateguard.lifecycle import LIVE, Action, fits
from stateguard_web.runs import queue, versions
from stateguard_web.runs.runtime import agent_names, config_for, guard_for, has_checkpoint
from stateguard_web.sagas import events, signals
from stateguard_web.sagas.journal import LeaseLost
from stateguard_web.sagas.journal.leases import abandoned, db_now, held
from stateguard_web.sagas.models import AuditEvent, Compensation, Run

logger = logging.getLogger("stateguard.tasks")
_ACTION_RETRY = {"countdown": 2, "max_retries": 60}  # two minutes of a busy run
NAMES = "stateguard_web.sagas.tasks"  # see the module's docstring
GuardAction = Callable[[Any, Any, dict[str, Any], Run], Any]
# The database out of reach (PostgreSQL restarting): the task is sent again after 2, 4, 8 ...
# up to 30 s (jittered) instead of being acknowledged as failed, which left a run pending until
# the sweeper found it had no message (six leases), or an operator's request waiting a lease.
# Safe: each task re-reads the run and acts under its lease, so a run it had already started
# (and lost with the connection) is not started again: its lease goes to recovery (issue 22 §3).
_DATABASE_DOWN: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError), "retry_backoff": 2,
    "retry_backoff_max": 30, "retry_jitter": True, "max_retries": 20}


def _with_guard(run: int | Run, action: GuardAction, task: Task | None = None, *,
                request: str = "", by: str = "") -> bool:
    """Run ``action`` with the run's guard, of the agent's version the run started on
    (``versions.choose``). ``request`` names an operator's request (made by ``by``) that the
    guard may refuse under the lease: the refusal is audited. ``False`` when another worker
    held the run and, with no ``task`` to retry, this backed off."""
    if not isinstance(run, Run):
        run = Run.objects.get(pk=run)
    if run.agent not in agent_names():
        _unknown_agent(run, request, by)
        return True
    try:
        guard, graph, _ = guard_for(run.agent, _version_for(run, request, by))
        action(guard, graph, config_for(run.thread_id), run)
    except _Held:  # journaled and audited: an operator's now
        pass
    except SagaAborted as exc:  # unwound and journaled; nothing more to do here
        logger.info("run %s aborted: %s", run.code, exc)
    except LeaseLost:  # another worker took the run over mid-way; it is theirs now
        logger.warning("run %s was taken over by another worker", run.code)
    except RunLocked as exc:
        if task is None:
            logger.info("run %s is held by another worker; backing off", run.code)
            return False
        raise task.retry(exc=exc, **_ACTION_RETRY) from exc
    except InvalidRunState as exc:  # the run moved on since the request, or a duplicate
        logger.info("run %s: %s", run.code, exc)
        if request:
            _refused(run, request, by, str(exc))
    except Exception as exc:
        # The guard held the run for an operator (its policy says a retry may fix this error)
        # and let the error through: that is the run's outcome, journaled, not the task's
        # failure. Anything else is.
        if not Run.objects.filter(pk=run.pk, status=Run.Status.FAILED).exists():
            raise
        logger.warning("run %s held for an operator: %s: %s", run.code, type(exc).__name__,
                       exc)
    return True


def _unknown_agent(run: Run, request: str, by: str) -> None:
    """A run of an agent this deployment does not offer (removed, renamed, or not enabled
    here). A run a worker would otherwise take up again and again (pending, or live with its
    worker gone) can never go on: it needs a person. An operator's request on a run that waits
    (paused, failed) is refused and the run left as it is."""
    message = (f"agent {run.agent!r} is not offered by this deployment (it offers "
               f"{', '.join(agent_names())})")
    if not _park(run, [Run.Status.PENDING, *LIVE], "UnknownAgent", message,
                 action="run.agent_unknown", data={"agent": run.agent}) and request:
        _refused(run, request, by, message)


class _Held(Exception):
    """The run was held for an operator, or the request refused (``_version_for``)."""


# An operator's unwind goes on on the current version when the run's own is gone: the
# compensations are found by node name, and it is how an operator clears a run held for it.
_UNWINDS = frozenset({Action.REJECT, Action.COMPENSATE, Action.RETRY_COMPENSATION,
                      Action.TERMINATE})


def _version_for(run: Run, request: str, by: str) -> str | None:
    """The agent's version to go on with ``run`` on (``runtime.guard_for``'s). A run whose
    version is no longer registered is held ``needs_attention`` with what changed (raises
    ``_Held``): going on on another graph may go wrong in ways no one sees. A pending run
    whose version is gone takes the current one instead: no step of it ran."""
    choice = versions.choose(run)
    if not choice.changed or request in _UNWINDS:
        return choice.version
    if run.status == Run.Status.PENDING:
        versions.restamp(run)
        return None
    if Run.objects.filter(held(), pk=run.pk).exists():
        raise RunLocked(f"run {run.code} is held by another worker")
    if not _park(run, [*LIVE, Run.Status.PAUSED, Run.Status.FAILED,
                       Run.Status.NEEDS_ATTENTION], "AgentChanged", choice.changed,
                 action="run.agent_changed", data={"request": request, "requested_by": by}):
        _refused(run, request, by, choice.changed)
    raise _Held


def _park(run: Run, statuses: list[str], error_type: str, message: str, *, action: str,
          data: dict[str, Any]) -> bool:
    """Hold ``run`` ``needs_attention`` for a person with ``message``, if it is in one of
    ``statuses`` and no live worker holds it; audit it. Whether it was."""
    now = db_now()
    with transaction.atomic():
        parked = Run.objects.filter(
            Q(lease_owner="") | abandoned(now), pk=run.pk, status__in=statuses,
        ).update(status=Run.Status.NEEDS_ATTENTION, updated_at=now, lease_owner="",
                 lease_expires_at=None, fencing_token=F("fencing_token") + 1,
                 error={"type": error_type, "message": message, "traceback": ""})
        if parked:
            AuditEvent.objects.create(run=run, actor="worker", action=action,
                                      data={**data, "message": message})
            signals.run_waits.send(sender=Run, run_code=str(run.code),
                                   status=Run.Status.NEEDS_ATTENTION)
            logger.error("run %s needs attention: %s", run.code, message)
    return bool(parked)


def _refused(run: Run, request: str, by: str, reason: str) -> None:
    AuditEvent.objects.create(run=run, actor="worker", action="run.request_refused",
                              data={"request": request, "requested_by": by, "reason": reason})
    logger.warning("run %s: %s refused: %s", run.code, request, reason)


@shared_task(acks_late=True, name=f"{NAMES}.run_execute", **_DATABASE_DOWN)
def run_execute(run_pk: int) -> None:
    # Only a pending run starts: a duplicate delivery, or a delivery after the run finished,
    # must not start the graph again from its input (that would repeat every effect). The guard
    # makes it exact: it takes the run's lease and moves it from pending to running under it.
    # A plain query: the ORM's compiler cost more CPU than the query (P2, docs/benchmarks.md).
    with connection.cursor() as cursor:
        cursor.execute("SELECT code, agent, input, agent_version, graph_digest FROM sagas_run "
                       "WHERE id = %s AND status = %s", [run_pk, Run.Status.PENDING])
        row = cursor.fetchone()
    if row is None:
        return
    code, agent, data, version, digest = row
    run = Run(pk=run_pk, code=code if isinstance(code, uuid.UUID) else uuid.UUID(code),
              agent=agent, status=Run.Status.PENDING, agent_version=version,
              graph_digest=digest, input=json.loads(data) if isinstance(data, str) else data)
    _with_guard(run, lambda guard, graph, config, run: guard.invoke(graph, run.input, config))


@shared_task(acks_late=True, bind=True, name=f"{NAMES}.run_request", **_DATABASE_DOWN)
def run_request(self: Task, run_pk: int, request_id: str) -> None:
    """Carry out the operator's request left on the run (``services._request``): approve or
    reject (the service decided the approval), retry (from an earlier step too), compensate,
    terminate.
    The guard checks, under the
    run's lease, that it still fits the run. Once carried out or refused, the request is
    cleared, and a duplicate delivery finds nothing to do."""
    run = Run.objects.get(pk=run_pk)
    request = run.request or {}
    if request.get("id") != request_id:
        logger.info("run %s: request %s was carried out already", run.code, request_id)
        return
    action, by = request["action"], request["by"]

    def carry_out(guard: Any, graph: Any, config: dict[str, Any], run: Run) -> None:
        if action == Action.APPROVE:
            guard.approve(graph, config, by=by, step_id=request["step_id"])
        elif action == Action.REJECT:
            guard.reject(graph, config, by=by, step_id=request["step_id"],
                         reason=request.get("reason", ""))
        elif action == Action.RETRY:
            guard.retry(graph, config)
        elif action == Action.RETRY_FROM:
            guard.retry(graph, config, from_step=request["from_step"],
                        update=request.get("update"), by=by)
        elif action == Action.COMPENSATE:
            guard.compensate(graph, config, by=by)
        elif action == Action.RETRY_COMPENSATION:
            guard.retry_compensation(graph, config, request["step_id"], by=by)
        elif action == Action.TERMINATE:
            # A worker running the run holds its lease (RunLocked: tried again later); it
            # sees the request at its lease's next heartbeat and stops at the next step
            # boundary. Taken here: a pending run, or one whose worker died.
            guard.terminate(graph, config, then=request["then"], by=by,
                            reason=request.get("reason", ""), request_id=request_id)
        else:
            raise InvalidRunState(f"unknown request {action!r}")

    # A RunLocked retry raises out of here and leaves the request for the next attempt. Not
    # a terminate's: the worker holding the run carries it out (or, should it die, recovery,
    # or this again once the sweep finds the run abandoned), and it stays on the run for them.
    if not _with_guard(run, carry_out, None if action == Action.TERMINATE else self,
                       request=action, by=by):
        return
    if Run.objects.filter(pk=run_pk, request__id=request_id).update(request=None,
                                                                    requested_at=None):
        # Live pages say the request is no longer waiting (and re-read the run).
        events.publish_change(run.code, "run.request", action=None, done=action, by=by)


@shared_task(acks_late=True, name=f"{NAMES}.run_recover", **_DATABASE_DOWN)
def run_recover(run_pk: int) -> None:
    """Take over a run whose worker died: unwind it or resume it, per the agent's policy.

    A run whose worker died before LangGraph saved its first checkpoint ran no step: it goes
    back to the queue instead."""
    if _requeue_if_never_started(run_pk):
        run_execute.delay(run_pk)
        return

    def recover(guard: Any, graph: Any, config: dict[str, Any], run: Run) -> None:
        spec = guard_for(run.agent)[2]
        AuditEvent.objects.create(run=run, actor="sweeper", action="run.recovering",
                                  data={"policy": spec.on_crash,
                                        "dead_owner": run.lease_owner})
        guard.recover(graph, config, resume=spec.on_crash == "resume")

    _with_guard(run_pk, recover)


@shared_task(acks_late=True, name=f"{NAMES}.run_retry_compensations", **_DATABASE_DOWN)
def run_retry_compensations(run_pk: int) -> None:
    """The next round of a compensating run's waiting compensations, now that it is due
    (``RetryLater``; handed over by the sweeper): the core's recovery runs it, under the run's
    lease, skipping what was undone. A duplicate delivery finds the round done (the run
    compensated, or waiting for a later time) and does nothing."""
    if not _due_compensations(db_now()).filter(run_id=run_pk).exists():
        return
    _with_guard(run_pk, lambda guard, graph, config, run: guard.recover(graph, config))


def _requeue_if_never_started(run_pk: int) -> bool:
    now = db_now()
    with transaction.atomic():
        # The row lock makes a late write of the dead worker wait for this decision; the new
        # fencing token then refuses it (sagas_fence), so it cannot start the run meanwhile.
        run = Run.objects.select_for_update().filter(
            abandoned(now), pk=run_pk, status=Run.Status.RUNNING).first()
        if run is None or has_checkpoint(run.thread_id):
            return False
        Run.objects.filter(pk=run_pk).update(
            status=Run.Status.PENDING, updated_at=now, lease_owner="", lease_expires_at=None,
            fencing_token=F("fencing_token") + 1)
    return True


def _due_compensations(now: datetime) -> QuerySet[Compensation]:
    """Waiting compensations whose next round has come (the partial index
    ``sagas_compensation_waiting``: the waiting few, by time)."""
    return Compensation.objects.filter(status=Compensation.Status.WAITING, retry_at__lte=now)


def _waiting_for_a_round(now: datetime) -> QuerySet[Run]:
    """Compensating runs that no worker holds and whose waiting compensations are due, each
    with ``due_at``, the latest due ``retry_at`` of its compensations."""
    due = _due_compensations(now)
    latest = due.filter(run=OuterRef("pk")).order_by("-retry_at").values("retry_at")[:1]
    return Run.objects.filter(pk__in=due.values("run_id"), status=Run.Status.COMPENSATING,
                              lease_owner="").annotate(due_at=Subquery(latest))


def _due(runs: QuerySet[Run], now: datetime, *, again: Q | None = None) -> list[int]:
    """The runs of ``runs`` not handed to a worker within the last lease period (or, with
    ``again``, since what it says happened), marked as handed now. However long the queue takes
    to reach them, a run is queued once per lease period at most (a sweep every few seconds
    would otherwise queue it again each time)."""
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    fresh = Q(requeued_at__isnull=True) | Q(requeued_at__lt=now - lease)
    with transaction.atomic():
        pks = list(runs.filter((fresh | again) if again is not None else fresh)
                   .select_for_update(skip_locked=True).values_list("pk", flat=True))
        Run.objects.filter(pk__in=pks).update(requeued_at=now)
    return pks


def _lost_pending(now: datetime, lease: timedelta) -> QuerySet[Run]:
    """Pending runs whose message is gone (a broker that lost its data, a message that
    expired), not those that wait their turn behind a backlog: submitted more than six leases
    ago, no live worker starting them, and sent before every message that may still wait in
    the runs' queue.

    That queue is first in, first out, and only runs' messages wait in it (the rest go to the
    ops queue, settings.py). When N messages wait there, they were sent for at most the N
    pending runs submitted last: a run submitted before the N-th newest pending one, and not
    handed again since, has no message left. A lease period more of margin spares the runs
    whose message a worker has just taken and that it has not leased yet (measured: 5 in
    10 000 otherwise). Counting each other message as a run's errs toward waiting: such a run
    is queued again once the queue is shorter. Before this, every pending run older than six
    leases was queued again each lease period however long the queue: a backlog of thousands
    doubled its messages every 10 s (issue 22 §6)."""
    old = Run.objects.filter(Q(lease_owner="") | abandoned(now), status=Run.Status.PENDING,
                             created_at__lt=now - 6 * lease)
    try:
        waiting = queue.depth()
    except redis.RedisError as exc:  # the next sweep asks again
        logger.warning("sweep: the runs' queue's length is unknown (%r); no pending run is "
                       "queued again this time", exc)
        return old.none()
    if not waiting:
        return old
    # The submission of the N-th newest pending run: one step along the status index.
    nth = list(Run.objects.filter(status=Run.Status.PENDING).order_by("-created_at")
               .values_list("created_at", flat=True)[waiting - 1:waiting])
    if not nth:  # fewer pending runs than messages: every one may have its message there
        return old.none()
    cut = nth[0] - lease
    return old.filter(created_at__lt=cut).exclude(requeued_at__gte=cut)


def sweep_message_expiry() -> float:
    """Seconds a message queued by a sweep lives: sweeps piling up while the workers are down
    must not leave a burst of duplicates behind."""
    return 5 * float(settings.STATEGUARD_SWEEP_SECONDS)


@shared_task(acks_late=True, name=f"{NAMES}.sweep_expired_leases")
def sweep_expired_leases() -> int:
    """Hand to another worker what no worker is doing: live runs whose worker is gone or
    stopped renewing its lease (to recovery: ``leases.abandoned``), compensating runs whose
    waiting compensations are due (to their next round), runs submitted long ago that no
    worker claimed, and operators' requests that no worker carried out (their messages were
    lost). Every time is the database's.

    A compensating run that waits (its worker let go of it, a compensation ``waiting``) is not
    abandoned: it is left alone until its time has come, however long ago it last changed. One
    whose worker died in the middle of a round still holds that worker's lease: recovery's."""
    now = db_now()
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    expires = sweep_message_expiry()
    waits = Exists(Compensation.objects.filter(run=OuterRef("pk"),
                                               status=Compensation.Status.WAITING))
    dead = _due(Run.objects.filter(abandoned(now), status__in=list(LIVE))
                .exclude(waits, lease_owner=""), now)
    for pk in dead:
        run_recover.apply_async((pk,), expires=expires)
    # Once per retry_at come, whatever the lease period (a round may end, and its next one
    # come, within one).
    rounds = _due(_waiting_for_a_round(now), now, again=Q(requeued_at__lt=F("due_at")))
    for pk in rounds:
        run_retry_compensations.apply_async((pk,), expires=expires)
    lost = _due(_lost_pending(now, lease), now)
    for pk in lost:
        run_execute.apply_async((pk,), expires=expires)
    # Requests whose message was lost (or whose worker gave up): still fitting the run, and
    # no worker holds it.
    waiting = {pk: request for pk, request, status in Run.objects.filter(
        Q(lease_owner="") | abandoned(now), request__isnull=False,
        requested_at__lt=now - lease).values_list("pk", "request", "status")
        if fits(request["action"], status)}
    undone = _due(Run.objects.filter(pk__in=list(waiting)), now)
    for pk in undone:
        run_request.apply_async((pk, waiting[pk]["id"]), expires=expires)
    if dead or rounds or lost or undone:  # log what it found, not that it looked
        logger.info("sweep: %d runs to recovery %s, %d runs to their compensations' next round "
                    "%s, %d lost runs queued again %s, %d operator requests queued again %s",
                    len(dead), dead, len(rounds), rounds, len(lost), lost, len(undone), undone)
    return len(dead)


@shared_task(acks_late=True)
def purge_runs() -> int:
    """Beat's retention pass (``runs/retention.py``): batch after batch, each its own short
    transaction, for at most half the period between two passes, so that passes never overlap
    for long; what is left waits for the next. Safe to run twice at once: each batch skips the
    runs another holds locked. Nothing configured: nothing to do."""
    from stateguard_web.runs import retention  # imports the saver's package: only when used

    policy = retention.Policy.from_settings()
    if not policy.keep:
        return 0
    outcome = retention.purge_runs(policy=policy,
                                   max_seconds=settings.STATEGUARD_RETENTION_SECONDS / 2)
    if outcome.runs:
        logger.info("retention: %d runs purged in %d batches (%d deleted, %d thinned) %s",
                    outcome.runs, outcome.batches, outcome.deleted, outcome.thinned,
                    dict(outcome.by_status))
    return outcome.runs
