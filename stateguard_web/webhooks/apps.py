from __future__ import annotations

from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "stateguard_web.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
    default_auto_field = "django.db.models.BigAutoField"
