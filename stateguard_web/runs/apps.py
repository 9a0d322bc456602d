from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "stateguard_web.runs"
    label = "runs"
    verbose_name = "Runs: orchestration"
