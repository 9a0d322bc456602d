"""Admin refunds and the ledger: the journal stays read-only, money moves through services.

* **Effect ledger** (Payments > effect ledger): every effect, by run, kind and status, with
  what the ledger can vouch for (its state: ``in doubt`` where the undo of its step was tried
  and did not record undoing it; ``sagas.ledger``); a "Refund" action on one charge, and
  "Verify with Stripe".
* **Runs** (the journal's admin, extended here so that sagas never imports payments): the
  run's effects inline (with their state), a "Refund" action (all its charges) and "Verify
  with Stripe".

Both refunds go through a confirmation page (``<object>/refund/``) that shows each charge as
Stripe and the ledger see it now, and posts a ``RefundForm``: ``confirmation.refund_confirm``,
the one the dashboard's run page uses too. The actions and the page need
``payments.refund_effect`` (``accounts.access``: Ability.REFUND); without it the actions are
not offered and the page is a 403.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from stateguard_web.accounts import access
from stateguard_web.accounts.access import Ability
from stateguard_web.payments import reconcile_stripe, selectors
from stateguard_web.payments import stripe_client as stripe_module
from stateguard_web.payments.confirmation import refund_confirm
from stateguard_web.payments.drift import ReconcileError
from stateguard_web.payments.models import LedgerEffect
from stateguard_web.sagas import admin as sagas_admin
from stateguard_web.sagas.ledger import effect_state
from stateguard_web.sagas.models import Compensation, Effect, Run

MAX_DRIFT_MESSAGES = 30  # lines shown by "Verify with Stripe"; the command prints them all

EFFECT_FIELDS = ("run", "kind", "provider", "external_id", "amount", "currency", "status",
                 "state", "undoes", "node", "step_id", "idempotency_key", "recorded_at")


def with_undo_status(effects: QuerySet[Any]) -> QuerySet[Any]:
    """``effects`` with ``undo_status``: the status of the compensation of the step that made
    each (``None``: none), in the same query."""
    return effects.annotate(undo_status=Subquery(Compensation.objects.filter(
        run_id=OuterRef("run_id"), step__step_id=OuterRef("step_id")).values("status")[:1]))


class LedgerState:
    """The ledger's word for an effect (``sagas.ledger.effect_state``), as a column."""

    @admin.display(description="state")
    def state(self, obj: Effect) -> str:
        return effect_state(obj, getattr(obj, "undo_status", None)).replace("_", " ")


def _may_refund(request: HttpRequest) -> bool:
    return access.may(request.user, Ability.REFUND) and access.reads_all_runs(request.user)


class RefundActions:
    """What both admins share: the permission, "Verify with Stripe", the confirmation page."""

    admin_site: admin.AdminSite
    message_user: Any

    def has_refund_permission(self, request: HttpRequest) -> bool:
        return _may_refund(request)

    def _verify(self, request: HttpRequest, runs: QuerySet[Run]) -> None:
        try:
            report = reconcile_stripe.ledger_reconcile(runs=runs, by=request.user)
        except ReconcileError as exc:
            self.message_user(request, f"Could not verify with Stripe: {exc}", messages.ERROR)
            return
        for drift in report.unresolved[:MAX_DRIFT_MESSAGES]:
            self.message_user(request, str(drift), messages.WARNING)
        more = len(report.unresolved) - MAX_DRIFT_MESSAGES
        if more > 0:
            self.message_user(request, f"... and {more} more: run manage.py reconcile_effects",
                              messages.WARNING)
        hint = " (manage.py reconcile_effects --fix records what Stripe shows)"
        self.message_user(request, report.summary() + (hint if report.unresolved else "."),
                          messages.WARNING if report.unresolved else messages.SUCCESS)

    def refund_page(self, request: HttpRequest, *, run: Run, charges: list[Effect],
                    back: str, title: str) -> HttpResponse:
        if not _may_refund(request):
            raise PermissionDenied("refunds need the payments.refund_effect permission")
        confirmation = refund_confirm(
            run=run, charges=charges, by=request.user,
            data=request.POST if request.method == "POST" else None)
        if confirmation.done:
            for level, text in confirmation.told():
                self.message_user(request, text, level)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request), "title": title, "run": run,
            "states": confirmation.states or [], "form": confirmation.form,
            "error": confirmation.error, "back": back, "opts": LedgerEffect._meta,
            "run_url": reverse("admin:sagas_run_change", args=[run.pk]),
            "total_remaining": confirmation.total_remaining,
        }
        return TemplateResponse(request, "admin/payments/refund.html", context,
                                status=409 if confirmation.refused else 200)


def _object(queryset: QuerySet[Any], object_id: str) -> Any:
    if not object_id.isdigit():
        raise Http404("no such object")
    found = queryset.filter(pk=int(object_id)).first()
    if found is None:
        raise Http404("no such object")
    return found


class EffectInline(LedgerState, sagas_admin.ReadOnlyInline):
    model = LedgerEffect
    fields = ("kind", "external_id", "amount", "currency", "status", "state", "undoes", "node",
              "recorded_at")
    verbose_name_plural = "effects (the ledger)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return with_undo_status(super().get_queryset(request))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return access.reads_all_runs(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LedgerEffect)
class LedgerEffectAdmin(RefundActions, LedgerState, sagas_admin.ReadOnlyAdmin):
    list_display = ("external_id", "kind", "amount_shown", "status", "state", "run_link",
                    "node", "undoes", "recorded_at")
    list_filter = ("kind", "status", "provider")
    search_fields = ("external_id", "undoes")
    list_select_related = ("run",)
    date_hierarchy = "recorded_at"
    fields = EFFECT_FIELDS
    readonly_fields = EFFECT_FIELDS
    actions = ["refund", "verify_with_stripe"]
    change_form_template = "admin/payments/change_form.html"

    # Reading the ledger is reading runs: viewers and operators see it (accounts.access).
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return access.reads_all_runs(request.user)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return access.reads_all_runs(request.user)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return with_undo_status(super().get_queryset(request))

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None
                       ) -> bool:
        return lookup == "run__code" or super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        """An external id, or a run's id (its UUID) for that run's effects."""
        try:
            return queryset.filter(Q(run__code=uuid.UUID(search_term.strip()))), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    @admin.display(description="amount", ordering="amount")
    def amount_shown(self, obj: Effect) -> str:
        return stripe_module.money(obj.amount, obj.currency) if obj.amount is not None else "-"

    @admin.display(description="run")
    def run_link(self, obj: Effect) -> str:
        url = reverse("admin:payments_ledgereffect_changelist") + f"?run__code={obj.run.code}"
        return format_html('<a href="{}" title="this run\'s effects">{}</a>', url,
                           str(obj.run.code)[:8])

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.refund_view)
        return [path("<str:object_id>/refund/", view, name="payments_ledgereffect_refund"),
                *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        effect = LedgerEffect.objects.filter(pk=object_id).first() if object_id.isdigit() \
            else None
        refundable = effect is not None and effect.kind == "charge" and \
            effect.provider == selectors.STRIPE and _may_refund(request)
        url = reverse("admin:payments_ledgereffect_refund", args=[object_id]) \
            if refundable else ""
        return super().change_view(request, object_id, form_url,
                                   {**(extra_context or {}), "refund_url": url})

    @admin.action(description="Refund the selected charge", permissions=["refund"])
    def refund(self, request: HttpRequest, queryset: QuerySet[Effect]) -> HttpResponse | None:
        picked = list(queryset[:2])
        if len(picked) != 1 or picked[0].kind != "charge" or \
                picked[0].provider != selectors.STRIPE:
            self.message_user(request, "Select one Stripe charge to refund (a run's charges "
                                       "are refunded together from the run).", messages.WARNING)
            return None
        return redirect("admin:payments_ledgereffect_refund", picked[0].pk)

    @admin.action(description="Verify with Stripe", permissions=["refund"])
    def verify_with_stripe(self, request: HttpRequest, queryset: QuerySet[Effect]) -> None:
        self._verify(request, Run.objects.filter(pk__in=queryset.values("run_id")))

    def refund_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not _may_refund(request):
            raise PermissionDenied("refunds need the payments.refund_effect permission")
        charge = _object(LedgerEffect.objects.select_related("run")
                         .filter(kind="charge", provider=selectors.STRIPE), object_id)
        back = reverse("admin:payments_ledgereffect_change", args=[charge.pk])
        return self.refund_page(request, run=charge.run, charges=[charge], back=back,
                                title=f"Refund {charge.external_id}")


admin.site.unregister(Run)


@admin.register(Run)
class RunAdmin(RefundActions, sagas_admin.RunAdmin):
    inlines = [*sagas_admin.RunAdmin.inlines, EffectInline]
    actions = ["refund_run", "verify_with_stripe"]
    change_form_template = "admin/payments/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.refund_view)
        return [path("<str:object_id>/refund/", view, name="sagas_run_refund"),
                *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        run = Run.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        extra = {**(extra_context or {}), "refund_url": "", "ledger_url": ""}
        if run is not None and run.effects.exists():
            extra["ledger_url"] = (reverse("admin:payments_ledgereffect_changelist")
                                   + f"?run__code={run.code}")
            if _may_refund(request):
                extra["refund_url"] = reverse("admin:sagas_run_refund", args=[run.pk])
        return super().change_view(request, object_id, form_url, extra)

    @admin.action(description="Refund the selected run's charges", permissions=["refund"])
    def refund_run(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        picked = list(queryset[:2])
        if len(picked) != 1:
            self.message_user(request, "Select one run to refund.", messages.WARNING)
            return None
        return redirect("admin:sagas_run_refund", picked[0].pk)

    @admin.action(description="Verify with Stripe", permissions=["refund"])
    def verify_with_stripe(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        self._verify(request, queryset)

    def refund_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not _may_refund(request):
            raise PermissionDenied("refunds need the payments.refund_effect permission")
        run = _object(Run.objects.all(), object_id)
        charges = list(selectors.run_charges(run=run))
        if not charges:
            self.message_user(request, f"Run {run.code} has no Stripe charge in the ledger.",
                              messages.WARNING)
            return redirect("admin:sagas_run_change", run.pk)
        back = reverse("admin:sagas_run_change", args=[run.pk])
        return self.refund_page(request, run=run, charges=charges, back=back,
                                title=f"Refund run {run.code}")
