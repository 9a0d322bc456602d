"""``manage.py flush``, which also works on SQLite, where the audit trail refuses DELETE.

Django's flush empties every table: with TRUNCATE on PostgreSQL, which the append-only triggers
(migration 0007) leave alone on purpose, and with ``DELETE FROM`` on SQLite, which the trigger
``sagas_auditevent_no_delete`` refuses row by row. A trigger cannot tell "every row of every
table" from "these rows" (its condition sees one row), and letting some deletes through (rows
whose run is gone, say) would let anyone delete those. So on SQLite this command lifts that
trigger for the flush alone: it drops it and creates it again from its own SQL (as stored in
``sqlite_master``), in one transaction with the flush, so that a failed or cancelled flush keeps
it and no other connection ever sees the table without it. Emptying the whole database is its
owner's act, as TRUNCATE is on PostgreSQL; deleting or rewriting some events (ORM, admin, raw
SQL, and ``sqlflush``'s statements run by hand) is still refused.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.db import connections, transaction

TRIGGER = "sagas_auditevent_no_delete"


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        connection = connections[options["database"]]
        if connection.vendor != "sqlite":
            super().handle(**options)
            return
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = %s",
                           [TRIGGER])
            row = cursor.fetchone()
            if row is not None:
                cursor.execute(f"DROP TRIGGER {TRIGGER}")
            super().handle(**options)
            if row is not None:
                cursor.execute(row[0])
