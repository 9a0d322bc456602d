"""``python manage.py terminate RUN --then unwind|hold [--reason TEXT] [--by USERNAME]``: stop a
running run now."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from stateguard.stops import THEN
from stateguard_web.runs import services
from stateguard_web.runs.commands import ActionCommand
from stateguard_web.sagas.models import Run


class Command(ActionCommand):
    help = ("Terminate a pending or running run: its worker stops it at the next step, then "
            "unwinds it (its compensations, newest first) or holds it for an operator.")

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        # Required: what becomes of the run is the operator's choice, never a default.
        parser.add_argument("--then", required=True, choices=THEN,
                            help="once it stopped: unwind it, or hold it needing attention")
        parser.add_argument("--reason", default="", help="why, for the audit trail")

    def act(self, *, run: Run, by: services.By, options: dict[str, Any]) -> str:
        run = services.run_terminate(run=run, by=by, then=options["then"],
                                     reason=options["reason"])
        if run.status not in (Run.Status.PENDING, Run.Status.RUNNING):  # never started
            return f"terminated run {run.code} before it started: {run.status}"
        return (f"terminating run {run.code}: its worker stops it at the next step, then "
                + ("unwinds it" if options["then"] == "unwind" else "holds it"))
