from __future__ import annotations

from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "stateguard_web.payments"
    label = "payments"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Payments: the effect ledger and refunds"
