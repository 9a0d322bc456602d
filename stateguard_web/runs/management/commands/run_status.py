"""``python manage.py run_status UUID``: the run, its steps and compensations, as JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from stateguard_web.runs import selectors
from stateguard_web.runs.commands import run_argument


class Command(BaseCommand):
    help = "Print a run with its steps, compensations and approvals as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("code", help="the run's UUID")

    def handle(self, *args: Any, **options: Any) -> None:
        run = run_argument(options["code"])
        self.stdout.write(json.dumps(selectors.run_detail(run=run), indent=2))
