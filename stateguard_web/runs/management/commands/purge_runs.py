"""``python manage.py purge_runs [--dry-run] [--batch N]``: apply the retention policy now (what
beat's ``purge_runs`` task does every STATEGUARD_RETENTION_SECONDS), or say what it would take."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stateguard_web.runs import retention


def _positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 10_000:
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = ("Purge the finished runs STATEGUARD_RETENTION says are due (their steps and "
            "checkpoints; their thin row too unless it holds effects the ledger keeps).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true",
                            help="say what would go, delete nothing")
        parser.add_argument("--batch", type=_positive, metavar="N",
                            help="runs per transaction (1-10000; default "
                                 "STATEGUARD_RETENTION_BATCH)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            policy = retention.Policy.from_settings()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["batch"]:
            policy = retention.Policy(keep=policy.keep, ledger=policy.ledger,
                                      batch=options["batch"])
        if not policy.keep:
            self.stdout.write("STATEGUARD_RETENTION names no status: nothing is purged.")
            return
        if options["dry_run"]:
            self._report(retention.preview(policy=policy), "would go")
        else:
            self._report(retention.purge_runs(policy=policy, actor="manage.py purge_runs"),
                         "went")

    def _report(self, outcome: retention.Outcome, verb: str) -> None:
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(outcome.by_status.items()))
        self.stdout.write(f"{outcome.runs} runs {verb}" + (f" ({statuses})" if statuses else "")
                          + f": {outcome.deleted} deleted whole, {outcome.thinned} kept as a "
                          "thin row for their effects")
        if outcome.batches:
            self.stdout.write(f"in {outcome.batches} batches")
        if outcome.oldest is not None:
            self.stdout.write(f"oldest last change: {outcome.oldest.isoformat()}")
        if outcome.bytes is not None:
            self.stdout.write(f"about {outcome.bytes / 1e6:.1f} MB of tables and indexes "
                              "(space PostgreSQL reuses; VACUUM FULL returns it to the disk)")
