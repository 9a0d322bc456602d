"""``python manage.py submit_run AGENT --input '{...}'``: queue a run, print its UUID."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stateguard_web.runs import services
from stateguard_web.runs.commands import cli_actor


class Command(BaseCommand):
    help = "Submit a run of AGENT with a JSON object as input; prints the run's UUID."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent")
        parser.add_argument("--input", default="{}", help="the agent's input, a JSON object")
        parser.add_argument("--by", help="username to record as the submitter")

    def handle(self, *args: Any, **options: Any) -> None:
        by = cli_actor(options["by"]) if options["by"] else None
        try:
            run = services.run_submit(agent=options["agent"], input=options["input"], by=by)
        except services.SubmissionError as exc:
            details = "".join(f"\n  {'.'.join(map(str, e['loc']))}: {e['msg']}"
                              for e in exc.errors)
            raise CommandError(f"{exc}{details}") from exc
        self.stdout.write(str(run.code))
