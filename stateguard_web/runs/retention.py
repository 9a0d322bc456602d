"""Retention: finished runs purged after the time their status is kept, in short batches.

``STATEGUARD_RETENTION`` ({"succeeded": "30d", "compensated": "90d", "failed": "180d"}) says how
long after its last change (``updated_at``) a finished run of each status keeps its debugging data:
steps, compensations with their attempts, approvals, notifications and LangGraph's checkpoints.
A status it does not name is kept for ever. ``needs_attention`` and the live statuses cannot be
named (the system check, ``retention_checks``), and a run with an open ledger entry is never
purged, whatever its status: a compensation not done (running, waiting, failed, skipped in doubt),
an effect not compensated on a run that did not succeed, or an operator's request waiting.

The ledger outlives the debugging data. ``Effect.run`` is PROTECT, so a run with effects keeps a
thin row (``purged_at`` set): its effects, its audit events and the run's own fields stay, its
steps and checkpoints go. ``STATEGUARD_RETENTION_LEDGER`` ("7y"; unset: for ever) says when the
thin row and its effects go too. A run with no effect has no ledger: it is deleted whole. The
audit trail is never deleted (append-only, migration 0007): a deleted run's events keep its code
(``run_code``; the FK is set to NULL) and each batch writes one ``runs.purged`` event listing the
codes it purged: one event per batch, not per run, so that a purge does not grow the trail by as
many rows as it removes from the journal, and "which purge took run X" is still one query.

Each batch (``STATEGUARD_RETENTION_BATCH`` runs) is one short transaction: it locks its runs with
``FOR UPDATE SKIP LOCKED`` (a run an operator or a worker holds is left for the next batch), prunes
their checkpoints through the saver's public API (``prune(strategy="delete")``, one transaction of
three DELETEs by ``thread_id``), then deletes their rows by run id. Checkpoints go first: if the
batch then fails, the runs stay finished and whole but for their checkpoints, and the next batch
purges them again; the other way round would leave checkpoints no run names, for ever.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Value,
)
from django.db.models.expressions import RawSQL
from django.utils import timezone
from langgraph.checkpoint.postgres import PostgresSaver

from stateguard.records import DONE_COMPENSATIONS
from stateguard_web.runs.runtime import saver
from stateguard_web.sagas.models import (
    Approval,
    AuditEvent,
    Compensation,
    CompensationAttempt,
    Effect,
    Notification,
    Run,
    Step,
)

logger = logging.getLogger("stateguard.retention")

# The statuses a policy may name: finished, and not waiting for a person.
PURGEABLE = (Run.Status.SUCCEEDED, Run.Status.COMPENSATED, Run.Status.FAILED)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdwy])\s*$")
# What a purge deletes, child tables first, by run id: (model, column, its run id's path).
_DEBUG_TABLES: tuple[tuple[type[Any], str], ...] = (
    (CompensationAttempt, "compensation__run_id__in"),
    (Compensation, "run_id__in"),
    (Step, "run_id__in"),
    (Approval, "run_id__in"),
    (Notification, "run_id__in"),
)
# Every table with a foreign key to Run, and what a purge does to its rows (a test checks that
# the list is whole: a new one would make the run's DELETE fail, not lose rows quietly). By
# table, not model: the webhooks app sits above this one (it may not be imported from here).
RUN_REFERENCES = {"sagas_step": "delete", "sagas_compensation": "delete",
                  "sagas_approval": "delete", "sagas_notification": "delete",
                  "webhooks_delivery": "delete", "webhooks_runwebhook": "delete",
                  "sagas_effect": "ledger", "sagas_auditevent": "keep", "sagas_batchitem": "keep"}
# Runs whose submitter is still owed an event (webhooks/: a delivery not sent yet, retried for
# up to a day): kept until it is delivered or has failed, so its attempts stay visible.
_OWED_EVENT = "SELECT run_id FROM webhooks_delivery WHERE status = 'pending'"
CHECKPOINT_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def parse_duration(text: str) -> timedelta:
    """"30d", "12h", "7y" (365 days), "2w", "90m", "45s": a whole number and one unit."""
    match = _DURATION.match(str(text))
    if match is None or int(match[1]) <= 0:
        raise ValueError(f"{text!r} is not a duration: a positive whole number and one of "
                         f"{', '.join(_UNITS)} (\"30d\", \"7y\")")
    return timedelta(seconds=int(match[1]) * _UNITS[match[2]])


@dataclass(frozen=True)
class Policy:
    """The settings, parsed: how long each status is kept, and the ledger (None: for ever)."""

    keep: dict[str, timedelta]
    ledger: timedelta | None
    batch: int

    @classmethod
    def from_settings(cls) -> Policy:
        """Raises ValueError naming the setting (the system check says it at startup)."""
        raw = getattr(settings, "STATEGUARD_RETENTION", {}) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"STATEGUARD_RETENTION must map statuses to durations, not {raw!r}")
        keep = {}
        for status, text in raw.items():
            if status not in PURGEABLE:
                why = ("is never purged automatically" if status == Run.Status.NEEDS_ATTENTION
                       else "is not a finished status")
                raise ValueError(f"STATEGUARD_RETENTION names {status!r}, which {why}: it may "
                                 f"name {', '.join(PURGEABLE)}")
            try:
                keep[status] = parse_duration(text)
            except ValueError as exc:
                raise ValueError(f"STATEGUARD_RETENTION[{status!r}]: {exc}") from None
        ledger_text = getattr(settings, "STATEGUARD_RETENTION_LEDGER", "") or ""
        try:
            ledger = parse_duration(ledger_text) if ledger_text else None
        except ValueError as exc:
            raise ValueError(f"STATEGUARD_RETENTION_LEDGER: {exc}") from None
        if ledger is not None and any(ledger < kept for kept in keep.values()):
            raise ValueError(f"STATEGUARD_RETENTION_LEDGER ({ledger_text}) is shorter than a "
                             "status's retention: the ledger must outlive the steps")
        batch = getattr(settings, "STATEGUARD_RETENTION_BATCH", 500)
        if not isinstance(batch, int) or not 1 <= batch <= 10_000:
            raise ValueError(f"STATEGUARD_RETENTION_BATCH is {batch!r}: a whole number "
                             "from 1 to 10000")
        return cls(keep=keep, ledger=ledger, batch=batch)


def _open_ledger() -> Q:
    """Runs that must stay whatever their age: an unfinished compensation, an effect not undone
    on a run that did not succeed (the money is out and nobody put it back), a request waiting."""
    unfinished = Compensation.objects.filter(run=OuterRef("pk")).exclude(
        status__in=[str(s) for s in DONE_COMPENSATIONS])
    not_undone = Effect.objects.filter(run=OuterRef("pk")).exclude(
        status=Effect.Status.COMPENSATED)
    return (Exists(unfinished) | (~Q(status=Run.Status.SUCCEEDED) & Exists(not_undone))
            | Q(request__isnull=False) | Q(pk__in=RawSQL(_OWED_EVENT, [])))


def due(policy: Policy, status: str, now: datetime) -> QuerySet[Run]:
    """The runs of ``status`` whose debugging data is due to go, oldest first."""
    return (Run.objects.filter(status=status, purged_at__isnull=True,
                               updated_at__lt=now - policy.keep[status])
            .exclude(_open_ledger()).order_by("created_at"))


def ledger_due(policy: Policy, now: datetime) -> QuerySet[Run]:
    """The thin rows whose ledger is due to go with them, oldest first."""
    assert policy.ledger is not None
    return (Run.objects.filter(purged_at__isnull=False, updated_at__lt=now - policy.ledger)
            .exclude(_open_ledger()).order_by("created_at"))


@dataclass
class Outcome:
    """What went (or, in a dry run, would go)."""

    by_status: Counter[str] = field(default_factory=Counter)
    deleted: int = 0  # runs deleted whole (no ledger, or the ledger's time came)
    thinned: int = 0  # runs whose thin row stays for their effects
    batches: int = 0
    oldest: datetime | None = None
    bytes: int | None = None  # an estimate, PostgreSQL only

    @property
    def runs(self) -> int:
        return self.deleted + self.thinned


def _prune_checkpoints(codes: list[str]) -> None:
    checkpoints = saver()
    if isinstance(checkpoints, PostgresSaver):
        checkpoints.prune(codes, strategy="delete")  # one transaction for the whole batch
    else:  # SQLite (the embedded default): no bulk form
        for code in codes:
            checkpoints.delete_thread(code)


def _by_run(sql: str, ids: list[int]) -> None:
    """``sql`` with ``{ids}`` standing for the batch's run ids (PostgreSQL and SQLite alike)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.format(ids=", ".join(["%s"] * len(ids))), ids)


def _delete_debugging_data(ids: list[int]) -> None:
    """Plain DELETEs by run id, children first. Not ``QuerySet.delete()``: Django's collector
    loads every step and compensation (their JSON too) to follow their cascades, which made a
    batch of 500 runs take 2 s of this process's CPU instead of a tenth of that
    (docs/benchmarks.md, Retention)."""
    _by_run("DELETE FROM sagas_compensationattempt WHERE compensation_id IN "
            "(SELECT id FROM sagas_compensation WHERE run_id IN ({ids}))", ids)
    _by_run("DELETE FROM webhooks_attempt WHERE delivery_id IN "
            "(SELECT id FROM webhooks_delivery WHERE run_id IN ({ids}))", ids)
    for table in ("sagas_compensation", "sagas_step", "sagas_approval", "sagas_notification",
                  "webhooks_delivery", "webhooks_runwebhook"):
        _by_run(f"DELETE FROM {table} WHERE run_id IN ({{ids}})", ids)


def _delete_runs(ids: list[int]) -> None:
    """The runs, and their effects (the ledger's time has come, or they have none). Their
    audit events and batch items stay, with ``run`` NULL (their ``run_code`` says which)."""
    _by_run("DELETE FROM sagas_effect WHERE run_id IN ({ids})", ids)
    _by_run("UPDATE sagas_auditevent SET run_id = NULL WHERE run_id IN ({ids})", ids)
    _by_run("UPDATE sagas_batchitem SET run_id = NULL WHERE run_id IN ({ids})", ids)
    _by_run("DELETE FROM sagas_run WHERE id IN ({ids})", ids)


def _purge_batch(policy: Policy, status: str | None, now: datetime, actor: str) -> Outcome:
    """One transaction: lock up to ``policy.batch`` due runs (skipping locked ones), purge them.
    ``status`` None: the ledger's pass over thin rows."""
    outcome = Outcome()
    with transaction.atomic():
        due_runs = due(policy, status, now) if status is not None else ledger_due(policy, now)
        ledger_cutoff = now - policy.ledger if policy.ledger is not None else None
        rows = list(due_runs.select_for_update(skip_locked=True, of=("self",))
                    .annotate(has_effects=Exists(Effect.objects.filter(run=OuterRef("pk"))))
                    .values_list("pk", "code", "status", "updated_at", "purged_at",
                                 "has_effects")[:policy.batch])
        if not rows:
            return outcome
        ids = [row[0] for row in rows]
        fresh = [row for row in rows if row[4] is None]  # not thinned before
        if fresh:
            _prune_checkpoints([str(row[1]) for row in fresh])
            _delete_debugging_data([row[0] for row in fresh])
        whole = [row for row in rows if not row[5]
                 or (ledger_cutoff is not None and row[3] < ledger_cutoff)]
        thin = [row[0] for row in rows if row not in whole]
        if thin:
            Run.objects.filter(pk__in=thin).update(purged_at=now)
        if whole:
            _delete_runs([row[0] for row in whole])
        outcome.by_status.update(str(row[2]) for row in rows)
        outcome.deleted, outcome.thinned, outcome.batches = len(whole), len(thin), 1
        outcome.oldest = min(row[3] for row in rows)
        AuditEvent.objects.create(
            run=None, actor=actor, action="runs.purged" if status else "runs.ledger_purged",
            data={"runs": len(ids), "deleted": len(whole), "thinned": len(thin),
                  "by_status": dict(outcome.by_status),
                  "deleted_codes": [str(row[1]) for row in whole],
                  "thinned_codes": [str(row[1]) for row in rows if row[0] in thin]})
    return outcome


def purge_runs(*, policy: Policy | None = None, actor: str = "retention",
               max_seconds: float | None = None, max_batches: int | None = None) -> Outcome:
    """Purge what is due, batch after batch, until nothing is left (or the time or batch budget
    is spent: the beat task stops after ``max_seconds`` and goes on at its next turn)."""
    policy = policy or Policy.from_settings()
    now, started, total = timezone.now(), time.monotonic(), Outcome()
    passes: list[str | None] = [*policy.keep]
    if policy.ledger is not None:
        passes.append(None)
    for status in passes:
        while True:
            if max_batches is not None and total.batches >= max_batches:
                return total
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                return total
            batch = _purge_batch(policy, status, now, actor)
            if not batch.batches:
                break
            total.by_status.update(batch.by_status)
            total.deleted += batch.deleted
            total.thinned += batch.thinned
            total.batches += 1
            assert batch.oldest is not None
            total.oldest = min(filter(None, [total.oldest, batch.oldest]))
            logger.info("retention: purged %d runs (%d deleted, %d thinned) %s",
                        batch.runs, batch.deleted, batch.thinned, dict(batch.by_status))
    return total


def preview(*, policy: Policy | None = None) -> Outcome:
    """What ``purge_runs`` would take now, without taking it: counts per status, the oldest
    last change, and an estimate of the bytes (each table's average row size, from its total
    size and PostgreSQL's row estimate, times the rows that would go)."""
    policy = policy or Policy.from_settings()
    now, outcome = timezone.now(), Outcome()
    ledger_cutoff = now - policy.ledger if policy.ledger is not None else None
    has_effects = Exists(Effect.objects.filter(run=OuterRef("pk")))
    past_ledger = ExpressionWrapper(
        Q(updated_at__lt=ledger_cutoff) if ledger_cutoff is not None else Value(False),
        output_field=BooleanField())
    querysets: list[QuerySet[Run]] = [due(policy, s, now) for s in policy.keep]
    if policy.ledger is not None:
        querysets.append(ledger_due(policy, now))
    for runs in querysets:
        for row in (runs.order_by().annotate(has_effects=has_effects)
                    .annotate(past_ledger=past_ledger)
                    .values("status", "has_effects", "past_ledger")
                    .annotate(n=Count("pk"), oldest=Min("updated_at"))):
            whole = not row["has_effects"] or row["past_ledger"]
            outcome.by_status[row["status"]] += row["n"]
            if whole:
                outcome.deleted += row["n"]
            else:
                outcome.thinned += row["n"]
            outcome.oldest = min(filter(None, [outcome.oldest, row["oldest"]]))
    if connection.vendor == "postgresql" and outcome.runs:
        outcome.bytes = _estimate_bytes(querysets)
    return outcome


def _estimate_bytes(querysets: list[QuerySet[Run]]) -> int:
    """Rows that would go, per table, times the table's average bytes per row (indexes and
    TOAST included). The run rows themselves are counted in full (thin rows stay: an over-
    estimate by their size, a few hundred bytes each)."""
    total = 0.0
    for runs in querysets:
        fresh = runs.filter(purged_at__isnull=True).values("pk")
        counts = {Run._meta.db_table: runs.count()}
        for model, path in _DEBUG_TABLES:
            counts[model._meta.db_table] = model.objects.filter(**{path: fresh}).count()
        codes = [str(code) for code in runs.filter(purged_at__isnull=True)
                 .values_list("code", flat=True).iterator()]
        with connection.cursor() as cursor:
            for table in CHECKPOINT_TABLES:
                cursor.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ANY(%s)", [codes])
                counts[table] = cursor.fetchone()[0]
            for table, n in counts.items():
                if not n:
                    continue
                cursor.execute("SELECT pg_total_relation_size(%s::regclass), reltuples "
                               "FROM pg_class WHERE oid = %s::regclass", [table, table])
                size, tuples = cursor.fetchone()
                if tuples < 1:  # never analyzed (-1): count them
                    cursor.execute(f"SELECT count(*) FROM {table}")
                    tuples = cursor.fetchone()[0]
                total += n * size / max(tuples, n)
    return int(total)
