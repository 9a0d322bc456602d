"""The saga journal: runs, their steps, compensations with every attempt, approvals, audit.

Statuses are ``TextChoices`` backed by a ``CheckConstraint``; the rules that must never break
(one pending approval per run and node, one compensation record per step) are DB constraints.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import OrderBy, Q
from django.db.models.functions import Coalesce

from stateguard import lifecycle
from stateguard import records as core
from stateguard.effects import EffectStatus as CoreEffectStatus
from stateguard.kinds import StepKind as CoreStepKind


def _status_check(name: str, choices: type[models.TextChoices]) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(status__in=choices.values), name=name)


def _choices(name: str, statuses: type[StrEnum]) -> type[models.TextChoices]:
    """Django choices made from the core's statuses, so that there is one list of them (the
    core's, whose meaning and transitions ``stateguard.lifecycle`` defines). The labels are the
    ones Django makes from the names ("Needs Attention")."""
    return models.TextChoices(name, [(s.name, s.value) for s in statuses])  # type: ignore[return-value]


RunStatus = _choices("RunStatus", core.RunStatus)
StepStatus = _choices("StepStatus", core.StepStatus)
CompensationStatus = _choices("CompensationStatus", core.CompensationStatus)
ApprovalStatus = _choices("ApprovalStatus", core.ApprovalStatus)
EffectStatus = _choices("EffectStatus", CoreEffectStatus)
StepKind = _choices("StepKind", CoreStepKind)


def run_duration() -> models.ExpressionWrapper:
    """A run's duration as the runs list shows and sorts it: from when a worker took it up
    to its outcome, or, before one (running, failed), to its last change; zero for a run no
    worker took yet (the list shows "—"). Never NULL: an index of SQLite's cannot say where
    NULLs go. The index ``sagas_run_duration`` is on this very expression."""
    end = Coalesce(models.F("finished_at"), models.F("updated_at"))
    return models.ExpressionWrapper(end - Coalesce(models.F("started_at"), end),
                                    output_field=models.DurationField())


class Run(models.Model):
    Status = RunStatus

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    agent = models.CharField(max_length=100)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    error = models.JSONField(null=True, blank=True)
    # The worker executing the run holds a lease and renews it; the fencing token grows with
    # every new holder, so writes from a worker that lost its lease are refused.
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.PositiveBigIntegerField(default=0)
    # The process lock (journal/process_lock.py) the holder held when it last took or renewed
    # the lease: once no session holds it, the holder's process is gone and the run is
    # recovered at once, without waiting for the expiry (journal/leases.py). NULL: the expiry
    # alone (SQLite, or no lock). Not indexed, like the other lease columns.
    lease_lock = models.IntegerField(null=True, blank=True)
    # When the sweeper last handed the run to a worker (lost, or its worker dead): it does so
    # at most once per lease period, however long the queue takes to get to it.
    requeued_at = models.DateTimeField(null=True, blank=True)
    # The operator's request a worker has yet to carry out (approve, reject, retry or
    # compensate): {"id", "action", "by", ...}. One at a time: see runs.services._request.
    request = models.JSONField(null=True, blank=True)
    requested_at = models.DateTimeField(null=True, blank=True)
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    # The submitter's idempotency key, and what it was used for (agent and input, hashed):
    # the same key again gives back this run, or a conflict for another submission.
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    submission_hash = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When the run first reached an outcome (succeeded, compensated or needs_attention), and
    # which one. Set once by a trigger on whichever write gets there first, and never changed
    # after (migration 0012): GET /metrics counts each run once, with a duration that stays.
    finished_at = models.DateTimeField(null=True, blank=True, editable=False)
    finished_status = models.CharField(max_length=20, blank=True, default="", editable=False)
    # The incident a run is, or last was (failed, or needs attention): the step it failed at
    # (its newest failed or violated step; else the step it was in when it stopped, in doubt),
    # its error's type ("APIConnectionError"), and when it got there. Set by a trigger
    # whenever a run's status becomes one of those or its error changes (migration 0022), so
    # that every writer (the journal's SQL, services, the admin) keeps them true, and the
    # Incidents page groups runs by one index (``sagas_run_incidents``) instead of reading the
    # steps and errors of every run. "" when there is none (no step, no error); NULL on a
    # run that never was an incident. Nullable, so that adding them rewrites no row.
    failed_node = models.CharField(max_length=200, null=True, blank=True, editable=False)
    error_type = models.CharField(max_length=200, null=True, blank=True, editable=False)
    incident_at = models.DateTimeField(null=True, blank=True, editable=False)
    # When retention (runs/retention.py) deleted the run's steps, compensations, approvals and
    # checkpoints and kept this thin row for its effects (the ledger) and its audit trail.
    purged_at = models.DateTimeField(null=True, blank=True, editable=False)
    # When a worker first took the run from the queue (its first status past pending): set
    # once by a trigger, whichever write gets there (migration 0024), never changed after. The
    # workers page's "started per minute"; created_at to started_at is the time it queued.
    started_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The version of its agent the run was submitted on (runs/versions.py): what the agent
    # declares (agents.registry.register(version=...), "" if nothing) and the digest of its
    # graph's shape (stateguard.versions). A worker goes on with the run only on that version.
    # NULL: a run submitted before versions were recorded, which goes on as before. Nullable,
    # so that adding them rewrites no row (nor rebuilds the table, on SQLite: see 0012).
    agent_version = models.CharField(max_length=100, null=True, blank=True, editable=False)
    graph_digest = models.CharField(max_length=16, null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        # The roles (groups made by accounts' migration 0002) are made of these and the default
        # view_run; stateguard_web.accounts.access is the one place that reads them.
        permissions = [
            ("submit_run", "Can submit runs (and see the runs it submitted)"),
            ("operate_run", "Can approve, reject, retry, compensate and resolve runs"),
        ]
        constraints = [
            _status_check("sagas_run_status_valid", RunStatus),
            # POST /api/runs with an Idempotency-Key: one run per user and key, however many
            # requests race (the insert decides, not a read before it).
            models.UniqueConstraint(fields=["submitted_by", "idempotency_key"],
                                    condition=~Q(idempotency_key=""),
                                    name="sagas_run_unique_idempotency_key"),
        ]
        indexes = [
            # dashboard: runs by status, newest first
            models.Index(fields=["status", "-created_at"], name="sagas_run_status_created"),
            # dashboard: runs of one agent, newest first
            models.Index(fields=["agent", "-created_at"], name="sagas_run_agent_created"),
            models.Index(fields=["-created_at"], name="sagas_run_created"),
            # GET /metrics: runs that finished since the last scrape (monitoring/journal_metrics.py)
            models.Index(fields=["finished_at"], name="sagas_run_finished",
                         condition=Q(finished_at__isnull=False)),
            # Incidents (runs.incidents): failed and needs-attention runs counted by agent,
            # step and error type in one GROUP BY over this index alone (index-only), the
            # newest of each group and a group's runs (the runs list's filters) by a range.
            models.Index(fields=["agent", "failed_node", "error_type", "status", "incident_at"],
                         name="sagas_run_incidents",
                         condition=Q(status__in=sorted(s.value for s in lifecycle.ATTENTION))),
            # The runs list narrowed to where runs last failed, in any status since (its counts
            # per status): the runs that ever failed only. The same columns as the one above,
            # so that the planner, which cannot tell how many runs a group has, finds a run by
            # its whole key in either.
            models.Index(fields=["agent", "failed_node", "error_type", "status", "incident_at"],
                         name="sagas_run_failed_at", condition=Q(failed_node__isnull=False)),
            # Retention: the finished runs of a status not purged yet, oldest first. Partial, so
            # the thin rows it keeps for the ledger (years of them) are not read again and
            # again; created_at never changes and purged_at once, so lease writes stay HOT.
            models.Index(fields=["status", "created_at"], name="sagas_run_retention",
                         condition=Q(purged_at__isnull=True)),
            # Retention of the ledger: the thin rows, oldest first.
            models.Index(fields=["created_at"], name="sagas_run_purged",
                         condition=Q(purged_at__isnull=False)),
            # the workers page: runs started per minute over the last hour
            models.Index(fields=["started_at"], name="sagas_run_started",
                         condition=Q(started_at__isnull=False)),
            # The runs list sorted by when runs last changed, and by how long they took
            # (runs.selectors.run_order), read along an index either way. Each journal write
            # sets updated_at: these take that write out of its in-place (HOT) update, ~10 µs
            # more a write (bench/cockpit_runslist.py); the lease's renewals do not set it
            # and stay in place.
            models.Index(fields=["-updated_at"], name="sagas_run_updated"),
            models.Index(OrderBy(run_duration(), descending=True), name="sagas_run_duration"),
            # An agent's map, its versions (runs.versions.live_counts): the runs not finished
            # on each, one GROUP BY over this index alone. The finished runs (nearly all) are
            # not in it; without it the map read the whole table (bench/cockpit_pages.py).
            models.Index(fields=["agent", "agent_version", "graph_digest"],
                         name="sagas_run_live_versions",
                         condition=~Q(status__in=sorted(s.value for s in lifecycle.FINISHED))
                         & Q(graph_digest__isnull=False)),
            # The sweeper finds live runs through the status index (they are few). No index on
            # the lease columns: taking and renewing a lease then updates the row in place
            # (HOT, with the free space migration 0005 leaves in each page).
        ]

    # Not stored: runs.services.run_submit sets it when an idempotency key gave back this run.
    replayed = False

    def __str__(self) -> str:
        return f"{self.agent} {self.code} ({self.status})"

    @property
    def waiting_request(self) -> str | None:
        """The operator's request waiting for a worker, in words ("compensate by carol"), if
        it still fits the run (a request whose worker died mid-way no longer does: recovery
        has taken the run over). Its status alone says so (``lifecycle.fits``): the request was
        checked in full when it was made."""
        request = self.request or {}
        action = request.get("action")
        if not action or not lifecycle.fits(action, self.status):
            return None
        return f"{action} by {request.get('by', 'someone')}"

    @property
    def thread_id(self) -> str:
        """The LangGraph thread and the saga journal's run id."""
        return str(self.code)


class AgentVersion(models.Model):
    """A version of an agent that runs were submitted on, with its graph's shape: what lets a
    worker say what changed when the version a run started on is no longer registered ("nodes
    removed: ship"). Written once per version (the first submission on it inserts it)."""

    agent = models.CharField(max_length=100)
    version = models.CharField(max_length=100, blank=True)
    graph_digest = models.CharField(max_length=16)
    nodes = models.JSONField()  # sorted node names
    edges = models.JSONField()  # sorted [source, target, conditional]
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One row per version: a submission inserts it and ignores the conflict.
            models.UniqueConstraint(fields=["agent", "version", "graph_digest"],
                                    name="sagas_agentversion_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.version or '-'} {self.graph_digest}"


class Step(models.Model):
    Status = StepStatus

    # No index of its own: the (run, step_id) unique constraint's index serves lookups by run,
    # and one index fewer is one write fewer for every step (P2, docs/benchmarks.md).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps",
                            db_index=False)
    step_id = models.CharField(max_length=200)  # LangGraph task id
    node = models.CharField(max_length=200)
    tags = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.STARTED)
    attempt = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    done_seq = models.PositiveIntegerField(null=True, blank=True)  # completion order in the run
    update = models.JSONField(null=True, blank=True)
    state_after = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # The status before the latest start: "started" there means an earlier run of this step
    # never finished (its worker died), so this run of it is a re-run of a step in doubt;
    # "paused" means the body paused itself by interrupt() and this run is its resumption.
    prev_status = models.CharField(max_length=20, blank=True, null=True)
    # Its saga kind (stateguard.kinds): past a succeeded pivot the run is not unwound.
    kind = models.CharField(max_length=20, choices=StepKind.choices,
                            default=StepKind.COMPENSATABLE)

    class Meta:
        ordering = ["run", "started_at"]
        constraints = [
            _status_check("sagas_step_status_valid", StepStatus),
            models.CheckConstraint(condition=Q(kind__in=StepKind.values),
                                   name="sagas_step_kind_valid"),
            models.UniqueConstraint(fields=["run", "step_id"], name="sagas_step_unique_task"),
        ]
        indexes = [
            # GET /metrics: steps finished since the last scrape (journal_metrics.py); without
            # it each scrape reads every step. Its cost per step is in docs/deploy.md.
            models.Index(fields=["finished_at"], name="sagas_step_finished",
                         condition=Q(finished_at__isnull=False)),
            # An agent's map and the runs list's "stopped at" filter (runs/agent_map.py): the
            # steps that did not succeed, by run, with their node and status (read from the
            # index alone). A step is in it from its start until it succeeds (one small index
            # entry per step); the map never reads the others.
            models.Index(fields=["run", "node"], include=["status"], name="sagas_step_stopped",
                         condition=Q(status__in=["started", "paused", "failed", "violated"])),
        ]

    def __str__(self) -> str:
        return f"{self.node} ({self.status})"


class Compensation(models.Model):
    Status = CompensationStatus

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="compensations")
    step = models.OneToOneField(Step, on_delete=models.CASCADE, related_name="compensation")
    node = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING)
    triggered_by = models.CharField(max_length=150, default="automatic")
    # A waiting compensation's next round (its retry policy's RetryLater): the sweeper hands
    # the run to recovery once it has come. NULL in every other status.
    retry_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "created_at"]
        # One record per step (the OneToOne) holds every attempt, so a step can never have two
        # succeeded compensations: re-runs skip a record that already succeeded.
        constraints = [_status_check("sagas_compensation_status_valid", CompensationStatus)]
        indexes = [
            # The sweeper, every few seconds: the waiting compensations that are due, by time,
            # without reading the compensations that finished (nearly all of them).
            models.Index(fields=["retry_at"], name="sagas_compensation_waiting",
                         condition=Q(status="waiting")),
        ]

    def __str__(self) -> str:
        return f"undo {self.node} ({self.status})"


class CompensationAttempt(models.Model):
    compensation = models.ForeignKey(Compensation, on_delete=models.CASCADE,
                                     related_name="attempts")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    ok = models.BooleanField()
    result = models.CharField(max_length=200, blank=True, default="")
    error = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["compensation", "number"]
        constraints = [models.UniqueConstraint(fields=["compensation", "number"],
                                               name="sagas_attempt_unique_number")]
        # GET /metrics: attempts made since the last scrape (monitoring/journal_metrics.py)
        indexes = [models.Index(fields=["finished_at"], name="sagas_attempt_finished")]


class Approval(models.Model):
    Status = ApprovalStatus

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    step_id = models.CharField(max_length=200)
    node = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    decided_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    requested_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "requested_at"]
        constraints = [
            _status_check("sagas_approval_status_valid", ApprovalStatus),
            models.UniqueConstraint(fields=["run", "step_id"], name="sagas_approval_unique_task"),
            models.UniqueConstraint(fields=["run", "node"], condition=Q(status="pending"),
                                    name="sagas_approval_one_pending_per_node"),
        ]
        indexes = [
            # The approvals inbox and the navigation's count: the pending few, oldest first,
            # without reading every approval ever decided (P5, docs/benchmarks.md).
            models.Index(fields=["requested_at"], name="sagas_approval_pending",
                         condition=Q(status="pending")),
            # An agent's map and the runs list's "stopped at" filter (runs/agent_map.py): the
            # approvals that hold or stopped a run, by run, without the approved ones.
            models.Index(fields=["run", "node"], include=["status"],
                         name="sagas_approval_stopped",
                         condition=Q(status__in=["pending", "rejected"])),
        ]


class Effect(models.Model):
    """The ledger: an external effect a step made (a charge, a refund), as the code that made it
    declared it (``stateguard.record_effect``), or as a reconciliation found it."""

    Status = EffectStatus

    # PROTECT: money records outlive any pruning of the journal; a run with effects stays.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="effects")
    step_id = models.CharField(max_length=200)  # the step that made it, or that it undoes
    node = models.CharField(max_length=200)
    provider = models.CharField(max_length=200)
    kind = models.CharField(max_length=200)
    external_id = models.CharField(max_length=200)
    amount = models.PositiveBigIntegerField(null=True, blank=True)  # smallest currency unit
    currency = models.CharField(max_length=10, blank=True, default="")
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    undoes = models.CharField(max_length=200, blank=True, default="")  # external id undone
    status = models.CharField(max_length=30, choices=Status.choices, default=Status.APPLIED)
    recorded_at = models.DateTimeField()

    class Meta:
        ordering = ["run", "recorded_at"]
        constraints = [
            _status_check("sagas_effect_status_valid", EffectStatus),
            # An effect is recorded once, however many times (and by whom) it is found.
            models.UniqueConstraint(fields=["provider", "external_id"],
                                    name="sagas_effect_unique_external"),
        ]
        indexes = [
            # settling a charge: the refunds that undo it
            models.Index(fields=["provider", "undoes"], name="sagas_effect_undoes"),
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.kind} {self.external_id} ({self.status})"


class AuditEvent(models.Model):
    """Append-only: who did what to which run, and when.

    ``save()`` of a stored event and ``delete()`` refuse here; triggers (migrations 0007 and
    0013) refuse every other UPDATE and DELETE in the database (``QuerySet.update()``/
    ``.delete()``, raw SQL), except setting ``run`` to NULL when the run is deleted: the trail
    outlives the run, and ``run_code`` (the run's public UUID, copied when the event is made)
    still says which run it was about. Only ``manage.py flush`` empties the table.
    """

    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="audit_events")
    # The run's code, kept when the run is deleted (``run`` then becomes NULL). NULL for events
    # about no run (API keys), and for events of runs deleted before migration 0013.
    run_code = models.UUIDField(null=True, blank=True, editable=False)
    actor = models.CharField(max_length=150)  # a username, or "system"/"worker:<host>"
    action = models.CharField(max_length=50)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["run", "-created_at"], name="sagas_audit_run_created"),
            # the trail of a run by its code, also once the run is deleted
            models.Index(fields=["run_code"], name="sagas_audit_run_code"),
        ]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("audit events are append-only")
        if self.run_id is not None and self.run_code is None:
            self.run_code = self.run.code
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValueError("audit events are append-only")


class BatchAction(models.TextChoices):
    RETRY = "retry"
    COMPENSATE = "compensate"
    RETRY_COMPENSATIONS = "retry_compensations", "Retry failed compensations"


class BatchStatus(models.TextChoices):
    RUNNING = "running"  # items wait for the worker
    DONE = "done"  # every item was carried out, skipped or failed
    CANCELLED = "cancelled"  # cancelled: the items left were skipped


class BatchItemOutcome(models.TextChoices):
    PENDING = "pending"
    DONE = "done"  # the action was requested (and audited) for the run
    SKIPPED = "skipped"  # the run did not allow it (``reason`` says why)
    FAILED = "failed"  # an unexpected error (``reason``); the batch went on


class NotificationEvent(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval"
    NEEDS_ATTENTION = "needs_attention"


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"  # to every channel configured when it was sent
    FAILED = "failed"  # gave up after the last retry (``error`` says why)
    SKIPPED = "skipped"  # the run no longer waited when its turn came

class Batch(models.Model):
    """An operator's action over many runs at once (retry them, compensate them, or retry
    their failed compensations), carried out by a worker one run at a time through the same
    services as a single action: each run is checked, acted on and audited on its own, and a
    run that moved on since it was selected is skipped, with the reason in its item.

    The selection is frozen when the batch is made: explicit runs, or the runs a filter (the
    list's: ``runs.selectors.run_list``) matched then, one ``BatchItem`` each. ``selection`` keeps
    what the operator asked for, to show it. See ``batches/services.py``."""

    Action = BatchAction
    Status = BatchStatus

    code = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    action = models.CharField(max_length=30, choices=Action.choices)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    actor = models.CharField(max_length=150)  # the username, kept if the user goes
    via = models.CharField(max_length=200, blank=True, default="")  # "key sg_1a2b3c4d"
    reason = models.TextField(blank=True, default="")  # passed to each compensation request
    selection = models.JSONField(default=dict)  # {"runs": [code, ...]} or {"filter": {...}}
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True, default="")
    # The worker going through the items holds a lease on the batch, renewed after each item;
    # the sweeper hands a batch whose lease expired (its worker died) to another worker. The
    # lease is for liveness only: each item is carried out under its own row lock and only
    # while pending, so two workers on one batch still do each item once.
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            _status_check("sagas_batch_status_valid", BatchStatus),
            models.CheckConstraint(condition=Q(action__in=BatchAction.values),
                                   name="sagas_batch_action_valid"),
        ]
        indexes = [
            # the sweeper: batches not finished (few), by when their lease runs out
            models.Index(fields=["lease_expires_at"], name="sagas_batch_unfinished",
                         condition=Q(finished_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.action} batch {self.code} ({self.status})"


class BatchItem(models.Model):
    """One run of a batch, and what became of it."""

    Outcome = BatchItemOutcome

    # No index of its own: the (batch, position) unique constraint's index serves it.
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="items",
                              db_index=False)
    position = models.PositiveIntegerField()  # the order the worker goes in
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="+")
    run_code = models.UUIDField()  # kept if the run is deleted
    status_before = models.CharField(max_length=20)  # the run's status when it was selected
    outcome = models.CharField(max_length=20, choices=Outcome.choices,
                               default=Outcome.PENDING)
    reason = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "position"]
        constraints = [
            models.CheckConstraint(condition=Q(outcome__in=BatchItemOutcome.values),
                                   name="sagas_batchitem_outcome_valid"),
            # the worker's next pending item, in order; a batch's items in order
            models.UniqueConstraint(fields=["batch", "position"],
                                    name="sagas_batchitem_unique_position"),
            # a run is acted on once per batch, however it was selected
            models.UniqueConstraint(fields=["batch", "run_code"],
                                    name="sagas_batchitem_unique_run"),
        ]

    def __str__(self) -> str:
        return f"{self.run_code} ({self.outcome})"


class Notification(models.Model):
    """Operators told that a run waits for them (an approval, or attention), by e-mail and/or
    a webhook (``notifications/services.py``). One row per run and occurrence (``key``), made
    by the unique constraint: a duplicate delivery of the task, or a worker that writes the
    same status again (a redo after a crash), finds the row and sends nothing more."""

    Event = NotificationEvent
    Status = NotificationStatus

    # No index of its own: the (run, key) unique constraint's index serves it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notifications",
                            db_index=False)
    # Which occurrence: "approval:<step id>" (the gate's own id), "needs_attention:<id of the
    # operator's request whose unwind ended there, or 'auto'>".
    key = models.CharField(max_length=250)
    event = models.CharField(max_length=30, choices=Event.choices)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "created_at"]
        constraints = [
            _status_check("sagas_notification_status_valid", NotificationStatus),
            models.CheckConstraint(condition=Q(event__in=NotificationEvent.values),
                                   name="sagas_notification_event_valid"),
            models.UniqueConstraint(fields=["run", "key"],
                                    name="sagas_notification_unique_event"),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.key} ({self.status})"
