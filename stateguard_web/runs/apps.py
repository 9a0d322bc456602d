from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "stateguard_web.runs"
    label = "runs"
    verbose_name = "Runs: orchestration"

    def ready(self) -> None:
        from django.conf import settings

        from agents import registry
        from stateguard_web.runs import (
            checks,  # noqa: F401  (registers the agents' check)
            retention_checks,  # noqa: F401  (and retention's)
        )

        registry.use_modules(settings.STATEGUARD_AGENTS)
