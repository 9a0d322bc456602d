"""``python manage.py resolve RUN --note TEXT [--by USERNAME]``: a person undid what was left."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from stateguard_web.runs import services
from stateguard_web.runs.commands import ActionCommand
from stateguard_web.sagas.models import Run


class Command(ActionCommand):
    help = ("Mark a run that needs attention as compensated, once what StateGuard could not "
            "undo was undone by hand.")

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--note", required=True,
                            help="what was done by hand (for example: refunded in Stripe)")

    def act(self, *, run: Run, by: services.By, options: dict[str, Any]) -> str:
        run = services.run_resolve_by_hand(run=run, by=by, note=options["note"])
        return f"resolved run {run.code} by hand: it is {run.status}"
