"""``python manage.py reconcile_effects [--since ISO] [--fix] [--by USERNAME]``.

Compares the effect ledger with Stripe (``payments.reconcile``) and prints one line per drift
(``DRIFT ...``, or ``FIXED ...`` for what ``--fix`` recorded), then a summary. Exit status 0
when the ledger and Stripe agree (after fixing), 1 when drift remains: a cron job can alert on it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stateguard_web.payments import reconcile
from stateguard_web.runs.commands import cli_actor, os_actor


def _since(value: str) -> datetime:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--since {value!r} is not an ISO 8601 date or time "
                           "(2024-05-01, 2024-05-01T12:00:00Z)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = ("Compare the effect ledger with Stripe: charges tagged with a StateGuard run that "
            "the ledger lacks, refunds it lacks, amounts that differ. --fix records what "
            "Stripe shows.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", metavar="ISO",
                            help="only PaymentIntents created, and ledger charges recorded, "
                                 "from then on (UTC if no offset); default: everything")
        parser.add_argument("--fix", action="store_true",
                            help="record in the ledger the charges and refunds Stripe shows "
                                 "and the ledger lacks")
        parser.add_argument("--by", metavar="USERNAME",
                            help="with --fix, the user to record as acting (default: "
                                 "cli:<your login name>)")

    def handle(self, *args: Any, **options: Any) -> None:
        since = _since(options["since"]) if options["since"] else None
        by = (cli_actor(options["by"]) if options["by"] else os_actor()) if options["fix"] \
            else None
        try:
            report = reconcile.ledger_reconcile(since=since, fix=options["fix"], by=by)
        except reconcile.ReconcileError as exc:
            raise CommandError(f"could not read Stripe: {exc}") from exc
        for drift in report.drift:
            self.stdout.write(str(drift))
        self.stdout.write(report.summary())
        if report.unresolved:
            hint = "" if options["fix"] else " (--fix records what Stripe shows)"
            raise CommandError(f"{len(report.unresolved)} drift(s) remain{hint}", returncode=1)
