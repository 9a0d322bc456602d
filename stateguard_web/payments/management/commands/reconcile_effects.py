"""``python manage.py reconcile_effects [--provider NAME ...] [--since ISO] [--fix] [--by USER]``.

Compares the effect ledger with each provider's truth (``payments.reconcile``: Stripe, AWS, S3,
the SMTP server's mailbox) and prints one line per drift (``DRIFT ...``, or ``FIXED ...`` for
what ``--fix`` recorded), then a summary per provider; a provider this deployment does not
configure gets a ``SKIPPED`` line saying why. Exit status 0 when the ledger and the providers
agree (after fixing), 1 when drift remains, a provider could not be read, or one asked for by
name is not configured: a cron job can alert on it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stateguard_web.payments.drift import Scope
from stateguard_web.payments.reconcile import RECONCILERS, ledger_reconcile_all
from stateguard_web.runs.commands import cli_actor, os_actor

ALL = "all"


def _since(value: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--since {value!r} is not an ISO 8601 date or time "
                           "(2024-05-01, 2024-05-01T12:00:00Z)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = ("Compare the effect ledger with each provider (Stripe, AWS, S3, the SMTP server's "
            "mailbox): what a provider shows for a run that the ledger lacks, what the ledger "
            "holds that the provider does not, what is undone in one and not the other. --fix "
            "records what the providers show.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--provider", action="append", choices=[*RECONCILERS, ALL],
                            help="compare with this provider only (again for more); default: "
                                 "all, each that this deployment configures")
        parser.add_argument("--since", metavar="ISO",
                            help="only what was made at the provider, and recorded in the "
                                 "ledger, from then on (UTC if no offset); default: everything")
        parser.add_argument("--fix", action="store_true",
                            help="record in the ledger what the providers show for a run and "
                                 "the ledger lacks (nothing in the ledger is changed)")
        parser.add_argument("--by", metavar="USERNAME",
                            help="with --fix, the user to record as acting (default: "
                                 "cli:<your login name>)")

    def handle(self, *args: Any, **options: Any) -> None:
        since = _since(options["since"]) if options["since"] else None
        by = (cli_actor(options["by"]) if options["by"] else os_actor()) if options["fix"] \
            else None
        asked = options["provider"] or [ALL]
        names = None if ALL in asked else asked
        outcomes = ledger_reconcile_all(names=names, scope=Scope(since=since, fix=options["fix"],
                                                                 by=by))
        for outcome in outcomes:
            for line in outcome.lines():
                self.stdout.write(line)
        drift = sum(len(o.report.unresolved) for o in outcomes if o.report is not None)
        failed = [o.name for o in outcomes if o.error or (o.skipped and names is not None)]
        problems = []
        if drift:
            hint = "" if options["fix"] else " (--fix records what the providers show)"
            problems.append(f"{drift} drift(s) remain{hint}")
        if failed:
            problems.append(f"not compared: {', '.join(failed)}")
        if problems:
            raise CommandError("; ".join(problems), returncode=1)
