"""Admin for API keys: making one shows the key once; keys are revoked, not edited or deleted
(the audit trail names a key by its prefix, so the row that says whose it was stays)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from stateguard_web.accounts import services
from stateguard_web.accounts.forms import AdminLoginForm
from stateguard_web.accounts.models import ApiKey

# The admin's login is throttled as the dashboard's is (accounts/throttle.py).
admin.site.login_form = AdminLoginForm


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "prefix", "user", "created_at", "expires_at", "revoked_at",
                    "last_used_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user",)
    actions = ["revoke"]
    fields = ("user", "name", "expires_at")
    raw_id_fields = ("user",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # adding
            return ()
        return ("user", "name", "prefix", "created_at", "expires_at", "revoked_at",
                "last_used_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.fields if obj is None else self.get_readonly_fields(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:  # pragma: no cover - every field is read-only once made
            return
        obj._raw_key = services.api_key_issue(key=obj, by=request.user)  # type: ignore[attr-defined]

    def response_add(self, request: HttpRequest, obj: ApiKey,
                     post_url_continue: str | None = None) -> HttpResponse:
        # The key is in this page and nowhere else: not in a message (a cookie), not stored.
        context = {**self.admin_site.each_context(request), "key": obj,
                   "raw_key": getattr(obj, "_raw_key", ""), "opts": self.model._meta,
                   "title": "API key created"}
        return TemplateResponse(request, "admin/accounts/apikey/created.html", context)

    @admin.action(description="Revoke the selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = sum(services.api_key_revoke(key=key, by=request.user) for key in queryset)
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)
