from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "stateguard_web.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"
