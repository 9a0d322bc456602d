from __future__ import annotations

from django.apps import AppConfig


class SagasConfig(AppConfig):
    name = "stateguard_web.sagas"
    label = "sagas"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Saga runs"
