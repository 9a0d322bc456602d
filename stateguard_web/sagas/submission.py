"""A new run and its ``run.submitted`` audit event, stored by one SQL statement (PostgreSQL).

The two rows must exist together or not at all. Through the ORM that is a transaction: BEGIN,
two INSERTs, COMMIT, four round trips, and Django building and compiling each INSERT's SQL on
every call, which was a fifth of a submission's CPU in the web process (P6,
docs/benchmarks.md). Here a data-modifying CTE inserts both at once (one statement is atomic on
its own), its SQL made once per process from the models, on a server-side binding cursor that
psycopg prepares on pooled connections (``precompiled``). The values are what Django's
``Model.save()`` would write: each field's ``pre_save`` (defaults, ``auto_now_add``) and
``get_db_prep_save``. Inside a transaction (a caller's ``atomic``, or autocommit off), the
statement runs under a savepoint, as ``atomic()`` would, so that a refused row (the
idempotency key's unique constraint) leaves the caller's transaction usable.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import cache
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Field

from stateguard_web.precompiled import run_prepared
from stateguard_web.sagas.models import AuditEvent, Run


@cache
def _fields() -> tuple[list[Field[Any, Any]], list[Field[Any, Any]]]:
    """The columns written: the run's, and its audit event's but for the two taken from the
    new run (``run``, ``run_code``). Read from the models once per process."""
    def written(model: type[Any], *skip: str) -> list[Field[Any, Any]]:
        return [f for f in model._meta.concrete_fields
                if not f.primary_key and f.name not in skip]

    return written(Run), written(AuditEvent, "run", "run_code")


@cache
def _sql() -> str:
    run_fields, audit_fields = _fields()
    quote = connections[router.db_for_write(Run)].ops.quote_name
    run_table, audit_table = quote(Run._meta.db_table), quote(AuditEvent._meta.db_table)
    run_pk, run_code = quote(Run._meta.pk.column), quote(Run._meta.get_field("code").column)
    run_columns = ", ".join(quote(f.column) for f in run_fields)
    audit_columns = ", ".join(quote(f.column) for f in audit_fields)
    return (
        f"WITH new_run AS (INSERT INTO {run_table} ({run_columns}) "
        f"VALUES ({', '.join(['%s'] * len(run_fields))}) RETURNING {run_pk}, {run_code}), "
        f"new_event AS (INSERT INTO {audit_table} "
        f"({quote(AuditEvent._meta.get_field('run').column)}, "
        f"{quote(AuditEvent._meta.get_field('run_code').column)}, {audit_columns}) "
        f"SELECT new_run.{run_pk}, new_run.{run_code}, "
        f"{', '.join(['%s'] * len(audit_fields))} FROM new_run) "
        f"SELECT {run_pk} FROM new_run")


def insert_submitted(run: Run, event: AuditEvent) -> None:
    """Store ``run`` (new) and ``event``, its audit event, together; ``run`` gets its id.
    Raises ``IntegrityError`` (nothing stored) when a constraint refuses the run."""
    db = router.db_for_write(Run)
    connection = connections[db]
    run_fields, audit_fields = _fields()
    params = [f.get_db_prep_save(f.pre_save(run, True), connection) for f in run_fields]
    params += [f.get_db_prep_save(f.pre_save(event, True), connection) for f in audit_fields]
    in_transaction = connection.in_atomic_block or not connection.get_autocommit()
    with transaction.atomic(using=db) if in_transaction else nullcontext():
        (run.pk,) = run_prepared(connection, _sql(), params, lambda cursor: cursor.fetchone())
    run._state.adding, run._state.db = False, db
    event.run, event.run_code = run, run.code
