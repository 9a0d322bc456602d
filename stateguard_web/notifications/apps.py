from __future__ import annotations

from django.apps import AppConfig

from stateguard_web.sagas import signals


class NotificationsConfig(AppConfig):
    name = "stateguard_web.notifications"
    label = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from stateguard_web.notifications import receivers  # it needs the models: ready now

        signals.run_waits.connect(receivers.run_status_changed,
                                  dispatch_uid="notifications.run_waits")
