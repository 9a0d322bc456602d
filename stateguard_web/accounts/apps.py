from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "stateguard_web.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Accounts and API keys"

    def ready(self) -> None:
        # Here, not at import: keycache imports the models, which need the app registry.
        from stateguard_web.accounts import checks, keycache  # noqa: F401  (checks: registers)

        keycache.connect_signals()
