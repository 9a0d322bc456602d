"""``python manage.py submit_run AGENT --input '{...}'``: queue a run, print its UUID."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from stateguard_web.sagas import services


class Command(BaseCommand):
    help = "Submit a run of AGENT with a JSON object as input; prints the run's UUID."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent")
        parser.add_argument("--input", default="{}", help="the agent's input, a JSON object")
        parser.add_argument("--by", help="username to record as the submitter")

    def handle(self, *args: Any, **options: Any) -> None:
        by: Any = None
        if options["by"]:
            by = get_user_model().objects.filter(username=options["by"]).first()
            if by is None:
                raise CommandError(f"no user {options['by']!r}")
        try:
            run = services.run_submit(agent=options["agent"], input=options["input"], by=by)
        except services.SubmissionError as exc:
            details = "".join(f"\n  {'.'.join(map(str, e['loc']))}: {e['msg']}"
                              for e in exc.errors)
            raise CommandError(f"{exc}{details}") from exc
        self.stdout.write(str(run.code))
