"""Celery tasks: thin, take ids, idempotent (safe with ``acks_late`` redelivery).

A task that finds the run locked by another worker backs off: that worker is running it, or the
sweeper will hand the run to recovery once its lease expires.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from stateguard import InvalidRunState, RunLocked, SagaAborted
from stateguard_web.sagas.models import AuditEvent, Run

logger = logging.getLogger("stateguard.tasks")


def _with_guard(run_pk: int, action: Callable[[Any, Any, dict[str, Any], Run], Any]) -> None:
    from stateguard_web.sagas.runtime import config_for, guard_for

    run = Run.objects.get(pk=run_pk)
    guard, graph, _ = guard_for(run.agent)
    try:
        action(guard, graph, config_for(run.thread_id), run)
    except SagaAborted as exc:  # unwound and journaled; nothing more to do here
        logger.info("run %s aborted: %s", run.code, exc)
    except RunLocked:
        logger.info("run %s is held by another worker; backing off", run.code)
    except InvalidRunState as exc:  # a duplicate delivery of an action already done
        logger.info("run %s: %s", run.code, exc)


@shared_task(acks_late=True)
def run_execute(run_pk: int) -> None:
    # Claim the run: a duplicate delivery, or a delivery after the run finished, must not start
    # the graph again from its input (that would repeat every effect).
    if not Run.objects.filter(pk=run_pk, status=Run.Status.PENDING).update(
            status=Run.Status.RUNNING):
        return
    _with_guard(run_pk, lambda guard, graph, config, run: guard.invoke(graph, run.input, config))


@shared_task(acks_late=True)
def run_resume(run_pk: int, by: str, node: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.approve(graph, config, by=by,
                                                                        node=node))


@shared_task(acks_late=True)
def run_reject(run_pk: int, by: str, node: str, reason: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.reject(
        graph, config, by=by, node=node, reason=reason))


@shared_task(acks_late=True)
def run_retry(run_pk: int, by: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.retry(graph, config))


@shared_task(acks_late=True)
def run_compensate(run_pk: int, by: str) -> None:
    _with_guard(run_pk, lambda guard, graph, config, run: guard.compensate(graph, config, by=by))


@shared_task(acks_late=True)
def run_recover(run_pk: int) -> None:
    """Take over a run whose worker died: unwind it or resume it, per the agent's policy.

    A run whose worker died after claiming it but before its first step has no effect to
    undo: it goes back to the queue instead."""
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    if Run.objects.filter(pk=run_pk, status=Run.Status.RUNNING, steps__isnull=True,
                          lease_expires_at__isnull=True,
                          updated_at__lt=timezone.now() - lease).update(
            status=Run.Status.PENDING):
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


@shared_task(acks_late=True)
def sweep_expired_leases() -> int:
    """Find live runs whose worker stopped renewing its lease, and hand them to recovery.

    Also re-queues runs submitted long ago that no worker claimed (a lost broker message)."""
    now = timezone.now()
    lease = timedelta(seconds=settings.STATEGUARD_LEASE_SECONDS)
    dead = Run.objects.filter(
        Q(lease_expires_at__lt=now)
        # claimed (status running) but the worker died before it took the lease
        | Q(lease_expires_at__isnull=True, updated_at__lt=now - lease),
        status__in=[Run.Status.RUNNING, Run.Status.COMPENSATING],
    ).values_list("pk", flat=True)
    found = 0
    for pk in dead:
        run_recover.delay(pk)
        found += 1
    for pk in Run.objects.filter(status=Run.Status.PENDING,
                                 created_at__lt=now - 6 * lease).values_list("pk", flat=True):
        run_execute.delay(pk)
    return found
