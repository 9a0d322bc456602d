"""``python manage.py reject RUN --reason TEXT [--node NODE] [--by USERNAME]``: unwind a run."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from stateguard_web.runs import services
from stateguard_web.runs.commands import ActionCommand
from stateguard_web.sagas.models import Run


class Command(ActionCommand):
    help = "Reject the step a paused run waits on; a worker then compensates what the run did."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        # Required: the audit trail says why a step was refused.
        parser.add_argument("--reason", required=True, help="why, for the audit trail")
        parser.add_argument("--node", help="the node to reject, when more than one waits")

    def act(self, *, run: Run, by: services.By, options: dict[str, Any]) -> str:
        services.run_reject(run=run, by=by, node=options["node"], reason=options["reason"])
        return f"rejected run {run.code}: a worker compensates it"
