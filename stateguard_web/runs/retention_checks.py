"""``manage.py check`` (and every command that runs the checks, ``runserver`` and ``migrate``
among them) for the retention settings: a bad duration, a status that may not be purged
(``needs_attention``, a live one), a ledger kept less long than the steps, or a bad batch size is
an error naming the setting, at startup, rather than a failing beat task every hour."""

from __future__ import annotations

from typing import Any

from django.core import checks

from stateguard_web.runs.retention import Policy


@checks.register("stateguard")
def check_retention(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        Policy.from_settings()
    except ValueError as exc:
        return [checks.Error(str(exc), id="stateguard.E110",
                             hint="docs/deploy.md (Retention) says what the settings take")]
    return []
