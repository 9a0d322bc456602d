"""Annotations whose SQL the ORM compiles once per process, for the API's hottest reads.

Django builds and compiles a query's SQL anew on every call. For a plain lookup that is cheap,
but an expression of nested subqueries (a run's steps, compensations with their attempts,
approvals, effects and audit trail as JSON; a user's permissions) costs more CPU to build and
compile than PostgreSQL takes to run it: measured ~6x a plain lookup, more than the six queries
it replaces (P6, docs/benchmarks.md). Its SQL depends on the models only, so ``Precompiled``
has the ORM compile it on first use and keeps the text; each query then annotates itself with
it as ``RawSQL``, which costs nothing to compile. The expression must refer to the outer query
through ``OuterRef`` only (the outer model's table is the outer query's base table).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from django.db import connection
from django.db.models import Expression, Field, Model
from django.db.models.expressions import RawSQL


class Precompiled:
    """``build()``'s SQL as an annotation of ``model``'s queries (see the module)."""

    def __init__(self, model: type[Model], build: Callable[[], Expression],
                 output_field: Field[Any, Any]) -> None:
        self.model, self.build, self.output_field = model, build, output_field

    @cached_property
    def sql(self) -> tuple[str, tuple[Any, ...]]:
        query = self.model._default_manager.annotate(precompiled=self.build()).query
        sql, params = query.get_compiler(connection=connection).compile(
            query.annotations["precompiled"])
        return sql, tuple(params)

    def annotation(self) -> RawSQL:
        sql, params = self.sql
        return RawSQL(sql, params, output_field=self.output_field)
