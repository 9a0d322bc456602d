from __future__ import annotations

from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "stateguard_web.monitoring"
    label = "monitoring"
    verbose_name = "Monitoring"
