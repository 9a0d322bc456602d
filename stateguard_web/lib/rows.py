"""Model instances from the row of a plain SQL statement, through Django's public API.

For the few hot reads whose query the ORM would build and compile anew on every call, at
several times the cost of running it (an API key with its user, a run's detail: P6 in
docs/benchmarks.md). Such a statement names each model's columns with ``columns(Model,
alias)``, in the order ``read`` takes them back; its text is the same on every call, so
psycopg converts it once and, on a connection that has run it a few times, prepares it
(``server_side_binding`` and ``prepare_threshold`` in settings.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import Model


def columns(model: type[Model], alias: str, using: str = "default") -> str:
    """The model's columns, ``alias.column, ...``, in the order of its concrete fields."""
    quote = connections[using].ops.quote_name
    return ", ".join(f"{alias}.{quote(f.column)}" for f in model._meta.concrete_fields)


def read(row: Sequence[Any], *models: type[Model], using: str = "default"
         ) -> tuple[list[Any], list[Any]]:
    """The instances of ``models`` whose ``columns`` start ``row``, one after another (None
    for one whose primary key is NULL: an outer join found no row), and the columns after
    them. Each value goes through its field's ``from_db_value`` as the ORM reads it (JSON
    text becomes data), then ``Model.from_db`` makes the instance."""
    connection = connections[using]
    found: list[Any] = []
    start = 0
    for model in models:
        fields = model._meta.concrete_fields
        values = row[start:start + len(fields)]
        start += len(fields)
        if values[fields.index(model._meta.pk)] is None:
            found.append(None)
            continue
        found.append(model.from_db(using, [f.attname for f in fields], [
            f.from_db_value(value, None, connection) if hasattr(f, "from_db_value") else value
            for f, value in zip(fields, values, strict=True)]))
    return found, list(row[start:])
