"""Webhooks: the URL a run was submitted with (and the key whose secret signs its events:
``ApiKey.webhook_secret``), and the outbox: one ``Delivery`` per event, with every
``Attempt`` to send it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from stateguard_web.accounts.models import ApiKey
from stateguard_web.sagas.models import Run

# The run statuses that make an event, and its type (the trigger in migration 0001 lists them
# too: change both together).
EVENT_TYPES = {
    "succeeded": "run.succeeded",
    "compensated": "run.compensated",
    "failed": "run.failed",
    "needs_attention": "run.needs_attention",
    "paused": "run.awaiting_approval",
}


class RunWebhook(models.Model):
    """The URL a run's events go to, and the key whose secret signs them. Read by the trigger
    that writes the outbox (so a run without one costs that trigger one index lookup)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True,
                               related_name="webhook")
    url = models.URLField(max_length=2000)
    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="+")

    def __str__(self) -> str:
        return f"{self.run_id} → {self.url}"


class Delivery(models.Model):
    """One event to send (the outbox row), written by the trigger with the status change."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # every attempt for a day failed

    event_id = models.CharField(max_length=40, unique=True)  # evt_<32 hex>: the receiver dedups
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="webhook_deliveries",
                            db_index=False)
    type = models.CharField(max_length=40)
    data = models.JSONField(default=dict)  # the run as the status change left it
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When the sweep may next send it: due now, after a backoff, or after a claim by a sender
    # that may have died (the claim's end). NULL once delivered or failed.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.CheckConstraint(condition=Q(status__in=["pending", "delivered", "failed"]),
                                   name="webhooks_delivery_status_valid"),
        ]
        indexes = [
            # GET /api/runs/{code}/webhooks and the run page: a run's deliveries
            models.Index(fields=["run", "created_at"], name="webhooks_delivery_run"),
            # the sweep: pending deliveries that are due (few, among many delivered)
            models.Index(fields=["next_attempt_at"], name="webhooks_delivery_due",
                         condition=Q(status="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id} ({self.status})"


class Attempt(models.Model):
    """One POST of a delivery: what came back, or why nothing did."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    url = models.URLField(max_length=2000)
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response = models.CharField(max_length=500, blank=True, default="")  # the body's start
    error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"],
                                    name="webhooks_attempt_unique_number"),
        ]

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300
