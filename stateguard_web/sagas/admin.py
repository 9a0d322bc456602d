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


class ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    extra = 0
    can_delete = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(ReadOnlyInline):
    model = Step
    fields = ("node", "status", "attempt", "started_at", "finished_at", "done_seq", "error")


class CompensationInline(ReadOnlyInline):
    model = Compensation
    fields = ("node", "status", "triggered_by", "idempotency_key")


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


class AttemptInline(ReadOnlyInline):
    model = CompensationAttempt
    fields = ("number", "ok", "started_at", "finished_at", "result", "error")


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
    list_display = ("created_at", "actor", "action", "run", "run_code")
    list_filter = ("action",)
