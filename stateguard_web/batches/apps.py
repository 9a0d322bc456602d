from __future__ import annotations

from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "stateguard_web.batches"
    label = "batches"
    verbose_name = "Batches"
