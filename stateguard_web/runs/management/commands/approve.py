"""``python manage.py approve RUN [--node NODE] [--by USERNAME]``: let a paused run go on."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from stateguard_web.runs import services
from stateguard_web.runs.commands import ActionCommand
from stateguard_web.sagas.models import Run


class Command(ActionCommand):
    help = "Approve the step a paused run waits on; a worker then runs it."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--node", help="the node to approve, when more than one waits")

    def act(self, *, run: Run, by: services.By, options: dict[str, Any]) -> str:
        services.run_approve(run=run, by=by, node=options["node"])
        return f"approved run {run.code}: a worker resumes it"
