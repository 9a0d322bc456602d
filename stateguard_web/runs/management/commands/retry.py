"""``python manage.py retry RUN [--by USERNAME]``: resume a failed run from its failed step."""

from __future__ import annotations

from typing import Any

from stateguard_web.runs import services
from stateguard_web.runs.commands import ActionCommand
from stateguard_web.sagas.models import Run


class Command(ActionCommand):
    help = "Retry a failed run from the step that failed (never from the start)."

    def act(self, *, run: Run, by: services.By, options: dict[str, Any]) -> str:
        services.run_retry(run=run, by=by)
        return f"retrying run {run.code}: a worker resumes it from the failed step"
