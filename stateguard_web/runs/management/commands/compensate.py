"""``python manage.py compensate RUN [--by USERNAME]``: undo what a run did."""

from __future__ import annotations

from typing import Any

from stateguard_web.runs import services
from stateguard_web.runs.commands import ActionCommand
from stateguard_web.sagas.models import Run


class Command(ActionCommand):
    help = "Compensate a run: a worker undoes its steps' effects, newest first."

    def act(self, *, run: Run, by: services.By, options: dict[str, Any]) -> str:
        services.run_compensate(run=run, by=by)
        return f"compensating run {run.code}: a worker undoes its steps, newest first"
