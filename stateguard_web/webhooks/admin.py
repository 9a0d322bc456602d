"""Admin for webhooks: an API key's secret is made or rotated by an action on the API keys
(the new secret is shown on the page that answers, once, never in a message: a cookie), and a
run's deliveries and attempts can be read."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from stateguard_web.accounts.admin import ApiKeyAdmin
from stateguard_web.accounts.models import ApiKey
from stateguard_web.webhooks import services
from stateguard_web.webhooks.models import Attempt, Delivery


@admin.action(description="Make or rotate the webhook secret of the selected keys",
              permissions=["change"])
def rotate_webhook_secret(modeladmin: admin.ModelAdmin[ApiKey], request: HttpRequest,
                          queryset: QuerySet[ApiKey]) -> HttpResponse:
    user = request.user if request.user.is_authenticated else None
    secrets = [(key, services.key_secret_rotate(key=key, by=user)) for key in queryset]
    context = {**modeladmin.admin_site.each_context(request), "secrets": secrets,
               "title": "New webhook secrets"}
    return TemplateResponse(request, "admin/webhooks/secrets.html", context)


ApiKeyAdmin.actions = [*ApiKeyAdmin.actions, rotate_webhook_secret]


class AttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Attempt
    extra = 0
    can_delete = False
    fields = readonly_fields = ("number", "started_at", "duration_ms", "status_code",
                                "response", "error")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("event_id", "type", "run", "status", "attempts", "created_at",
                    "next_attempt_at")
    list_filter = ("status", "type")
    search_fields = ("event_id", "run__code")
    list_select_related = ("run",)
    inlines = [AttemptInline]
    readonly_fields = ("event_id", "run", "type", "data", "status", "attempts",
                       "next_attempt_at", "created_at", "delivered_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
