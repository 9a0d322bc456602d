"""Django admin over the saga journal: read-mostly (operators act through services)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from stateguard_web.sagas.models import (
    Approval,
    AuditEvent,
    Compensation,
    CompensationAttempt,
    Run,
    Step,
)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Step
    extra = 0
    can_delete = False
    fields = ("node", "status", "attempt", "started_at", "finished_at", "done_seq", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class CompensationInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Compensation
    extra = 0
    can_delete = False
    fields = ("node", "status", "triggered_by", "idempotency_key")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("code", "agent", "status", "created_at", "lease_owner")
    list_filter = ("status", "agent")
    search_fields = ("code", "agent")
    date_hierarchy = "created_at"
    inlines = [StepInline, CompensationInline]


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("run", "node", "status", "attempt", "started_at")
    list_filter = ("status",)


class AttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = CompensationAttempt
    extra = 0
    can_delete = False
    fields = ("number", "ok", "started_at", "finished_at", "result", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Compensation)
class CompensationAdmin(ReadOnlyAdmin):
    list_display = ("run", "node", "status", "triggered_by", "updated_at")
    list_filter = ("status",)
    inlines = [AttemptInline]


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("run", "node", "status", "decided_by", "requested_at", "decided_at")
    list_filter = ("status",)


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "run")
    list_filter = ("action",)
