"""Celery tasks: thin, take ids, idempotent (safe with ``acks_late`` redelivery).

``run_execute`` backs off when another worker holds the run: that worker is running it, or the
sweeper hands the run to recovery once its lease expires. An operator's action on a locked run
(the pausing worker has not let go yet, or another action is running) is retried a little
later instead of being dropped.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from stateguard import InvalidRunState, RunLocked, SagaAborted
from stateguard_web.sagas.journal import LeaseLost
from stateguard_web.sagas.models import AuditEvent, Run

logger = logging.getLogger("stateguard.tasks")
_ACTION_RETRY = {"countdown": 2, "max_retries": 60}  # two minutes of a busy run


def _with_guard(run: int | Run, action: Callable[[Any, Any, dict[str, Any], Run], Any],
                task: Task | None = None) -> None:
    from stateguard_web.sagas.runtime import config_for, guard_for

    if not isinstance(run, Run):
        run = Run.objects.get(pk=run)
    guard, graph, _ = guard_for(run.agent)
    try:
        action(guard, graph, config_for(run.thread_id), run)
    except SagaAborted as exc:  # unwound and journaled; nothing more to do here
        logger.info("run %s aborted: %s", run.code, exc)
    except LeaseLost:  # another worker took the run over mid-way; it is theirs now
        logger.warning("run %s was taken over by another worker", run.code)
    except RunLocked as exc:
        if task is None:
            logger.info("run %s is held by another worker; backing off", run.code)
            return
        raise task.retry(exc=exc, **_ACTION_RETRY) from exc
    except InvalidRunState as exc:  # a duplicate delivery of an action already done
        logger.info("run %s: %s", run.code, exc)


@shared_task(acks_late=True)
def run_execute(run_pk: int) -> None:
    # Only a pending run starts: a duplicate delivery, or a delivery after the run finished,
    # must not start the graph again from its input (that would repeat every effect). The guard
    # makes it exact: it takes the run's lease and moves it from pending to running under it.
    # A plain query: the ORM's compiler cost more CPU than the query (P2, docs/benchmarks.md).
    with connection.cursor() as cursor:
        cursor.execute("SELECT code, agent, input FROM sagas_run WHERE id = %s AND status = %s",
                       [run_pk, Run.Status.PENDING])
        row = cursor.fetchone()
    if row is None:
        return
    code, agent, data = row
    run = Run(pk=run_pk, code=code if isinstance(code, uuid.UUID) else uuid.UUID(code),
              agent=agent, status=Run.Status.PENDING,
              input=json.loads(data) if isinstance(data, str) else data)
    _with_guard(run, lambda guard, graph, config, run: guard.invoke(graph, run.input, config))


@shared_task(acks_late=True, bind=True)
def run_resume(self: Task, run_pk: int, by: str, node: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.approve(graph, config, by=by,
                                                                        node=node), self)


@shared_task(acks_late=True, bind=True)
def run_reject(self: Task, run_pk: int, by: str, node: str, reason: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.reject(
        graph, config, by=by, node=node, reason=reason), self)


@shared_task(acks_late=True, bind=True)
def run_retry(self: Task, run_pk: int, by: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.retry(graph, config), self)


@shared_task(acks_late=True, bind=True)
def run_compensate(self: Task, run_pk: int, by: str) -> None:
    from stateguard_web.sagas.services import COMPENSABLE

    def compensate(guard: Any, graph: Any, config: dict[str, Any], run: Run) -> None:
        if run.status in (Run.Status.RUNNING, Run.Status.COMPENSATING):
            raise RunLocked(run.thread_id)  # someone is on it: ask again when they are done
        # The run may have moved on since the operator asked (resolved by hand, say).
        if run.status not in COMPENSABLE:
            logger.info("run %s is %s now; not compensating", run.code, run.status)
            return
        guard.compensate(graph, config, by=by)

    _with_guard(run_pk, compensate, self)


@shared_task(acks_late=True)
def run_recover(run_pk: int) -> None:
    """Take over a run whose worker died: unwind it or resume it, per the agent's policy.

    A run whose worker died before LangGraph saved its first checkpoint ran no step: it goes
    back to the queue instead."""
    if _requeue_if_never_started(run_pk):
        run_execute.delay(run_pk)
        return

    def recover(guard: Any, graph: Any, config: dict[str, Any], run: Run) -> None:
        from stateguard_web.sagas.runtime import guard_for

        spec = guard_for(run.agent)[2]
        AuditEvent.objects.create(run=run, actor="sweeper", action="run.recovering",
                                  data={"policy": spec.on_crash,
                                        "dead_owner": run.lease_owner})
        guard.recover(graph, config, resume=spec.on_crash == "resume")

    _with_guard(run_pk, recover)


def _abandoned(now: datetime) -> Q:
    """Runs whose worker stopped renewing its lease, or left the run live without one (an
    error escaped the guard) longer than a lease ago."""
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    return (Q(lease_expires_at__lt=now)
            | Q(lease_expires_at__isnull=True, updated_at__lt=now - lease))


def _requeue_if_never_started(run_pk: int) -> bool:
    from stateguard_web.sagas.runtime import has_checkpoint

    now = timezone.now()
    with transaction.atomic():
        # The row lock makes a late write of the dead worker wait for this decision; the new
        # fencing token then refuses it (sagas_fence), so it cannot start the run meanwhile.
        run = Run.objects.select_for_update().filter(
            _abandoned(now), pk=run_pk, status=Run.Status.RUNNING).first()
        if run is None or has_checkpoint(run.thread_id):
            return False
        Run.objects.filter(pk=run_pk).update(
            status=Run.Status.PENDING, updated_at=now, lease_owner="", lease_expires_at=None,
            fencing_token=F("fencing_token") + 1)
    return True


@shared_task(acks_late=True)
def sweep_expired_leases() -> int:
    """Find live runs whose worker stopped renewing its lease, and hand them to recovery.

    Also re-queues runs submitted long ago that no worker claimed (a lost broker message)."""
    now = timezone.now()
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    dead = Run.objects.filter(_abandoned(now), status__in=[
        Run.Status.RUNNING, Run.Status.COMPENSATING]).values_list("pk", flat=True)
    found = 0
    # Messages expire, so that a backlog of sweeps does not pile up duplicates in the queue.
    expires = 5 * settings.STATEGUARD_SWEEP_SECONDS
    for pk in dead:
        run_recover.apply_async((pk,), expires=expires)
        found += 1
    for pk in Run.objects.filter(status=Run.Status.PENDING,
                                 created_at__lt=now - 6 * lease).values_list("pk", flat=True):
        run_execute.apply_async((pk,), expires=expires)
    return found
