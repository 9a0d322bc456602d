"""``python manage.py create_api_key NAME --role ROLE [--expires-in DAYS] [--user USERNAME]``.

Makes an API key named NAME for the service user NAME (made, in ROLE, if missing; or for
``--user``), and prints the key once on stdout, alone, so that scripts can capture it::

    KEY=$(python manage.py create_api_key billing-bot --role submitter)

What was done goes to stderr.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from stateguard_web.accounts import services
from stateguard_web.accounts.roles import Role


class Command(BaseCommand):
    help = "Make an API key for a service user in a role, and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the key's name, and the service user's username")
        parser.add_argument("--role", required=True, choices=[r.value for r in Role])
        parser.add_argument("--expires-in", type=int, metavar="DAYS",
                            help="the key expires after this many days (default: never)")
        parser.add_argument("--user", help="the user the key belongs to (default: NAME)")

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["name"]
        if not name or len(name) > 100 or not name.isprintable():
            raise CommandError("NAME must be 1 to 100 printable characters")
        days = options["expires_in"]
        if days is not None and not 1 <= days <= 36_500:
            raise CommandError("--expires-in must be between 1 and 36500 days")
        username = options["user"] or name
        user, created = services.service_user_ensure(username=username, role=options["role"])
        expires_at = timezone.now() + timedelta(days=days) if days else None
        key, raw = services.api_key_create(user=user, name=name, expires_at=expires_at,
                                           by="manage.py create_api_key")
        expiry = f"expires {expires_at.isoformat()}" if expires_at else "does not expire"
        self.stderr.write(
            f"{'Made' if created else 'Using'} user {username!r} (role {options['role']}); "
            f"key {key.prefix} {expiry}. The key is shown this once:")
        self.stdout.write(raw)
