"""Lookups whose SQL the ORM compiles once per process, for the API's hottest reads.

Django builds and compiles a query's SQL anew on every call. For the reads that every API
request makes (its key with the user's permissions; a run with its steps, compensations,
approvals, effects and audit trail as one PostgreSQL JSON object) that cost more CPU than
PostgreSQL takes to run them: a profile of Daphne under load (P6, docs/benchmarks.md) showed
the ORM's filter, join promotion and SQL compilation at about a fifth of a request, the queries
themselves far less. Their SQL depends on the models only, so ``CompiledGet`` has the ORM
compile the whole query on first use and keeps the text and how to read its rows (the same
steps as Django's ``ModelIterable``: the model's columns, ``select_related`` objects,
annotations, each column's converters); each call then runs the text with the value looked up.

The statement runs on a server-side binding cursor (Django's own bind client-side), so
psycopg prepares it once it has run ``prepare_threshold`` times on a connection (settings.py):
on the web processes' pooled connections PostgreSQL then skips planning it, which was most of
its cost (measured: 1.0-1.3 ms of PostgreSQL CPU for the key and a run's detail, 0.14-0.30 ms
prepared). psycopg still turns a statement's ``%s`` placeholders into ``$1, $2 ...`` on every
execute, and keeps the result only for statements under 4 kB and 50 parameters: the run's
history (~6 kB, ~90 parameters) was parsed anew on each call, 7 % of a detail request's CPU in
a profile of Daphne (P6). These statements are a handful per process, so their conversion is
kept (``_KeptConversion``). The SQL
names its columns, so a migration that adds one leaves a prepared statement valid; one that
changes the type of a column it reads makes PostgreSQL refuse it ("cached plan must not change
result type"), and psycopg would keep it: ``run_prepared`` then drops the connection's prepared
statements and runs it once more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar

import psycopg
from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators
from psycopg._queries import PostgresQuery, _query2pg_nocache

M = TypeVar("M", bound=Model)



class _KeptConversion(PostgresQuery):
    """psycopg's conversion of a query for the server, kept per query text without a bound on
    length or parameters (psycopg's own cache leaves out long queries, of which ORMs make
    endless variants; ``run_prepared``'s are made once per process). Relies on psycopg's
    ``PostgresQuery.convert`` setting ``query``, ``_want_formats``, ``_order`` and ``_parts``
    from ``_query2pg`` and then calling ``dump``, checked by tests/web/test_precompiled.py."""

    __slots__ = ()
    LIMIT: ClassVar[int] = 64  # statements kept; more would mean they are not made once
    _kept: ClassVar[dict[tuple[str | bytes, str], Any]] = {}

    def convert(self, query: Any, vars: Any) -> None:
        if vars is None or not isinstance(query, (str, bytes)):
            return super().convert(query, vars)
        key = (query, self._tx.encoding)
        converted = self._kept.get(key)
        if converted is None:
            if len(self._kept) >= self.LIMIT:
                return super().convert(query, vars)
            converted = self._kept[key] = _query2pg_nocache(self._ensure_bytes(query),
                                                             self._tx.encoding)
        self.query, self._want_formats, self._order, self._parts = converted
        self.dump(vars)


class _PreparingCursor(psycopg.Cursor[Any]):
    """Binds server-side and prepares what it runs on its first use on a connection, not after
    ``prepare_threshold`` uses: psycopg counts those uses in a cache of 100 statements that
    Django's queries (each with its values written in) fill too, so a lookup seldom reached
    the threshold on a busy connection."""

    _query_cls = _KeptConversion

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                binary: bool | None = None) -> Any:
        return super().execute(query, params, prepare=True, binary=binary)


_PLAN_CHANGED = "0A000"  # PostgreSQL: "cached plan must not change result type"


def run_prepared(connection: Any, sql: str, params: list[Any],
                 fetch: Callable[[Any], Any]) -> Any:
    """``fetch(cursor)`` after running ``sql``, prepared (see the module), through a Django
    cursor (its errors Django's, its queries logged where Django logs them). For statements
    made once per process: one prepared per call would fill psycopg's cache of them. After a
    migration changed a column it reads, the connection's prepared statements are dropped and
    it runs once more (outside a transaction; inside one, the rollback drops them)."""
    from django.db import NotSupportedError

    for last in (False, True):
        connection.ensure_connection()
        connection.validate_thread_sharing()
        cursor = _PreparingCursor(connection.connection)
        wrapped = (connection.make_debug_cursor(cursor) if connection.queries_logged
                   else connection.make_cursor(cursor))
        try:
            with wrapped:
                wrapped.execute(sql, params)
                log = connection.queries_log
                if connection.queries_logged and log and log[-1]["sql"] is None:
                    log[-1]["sql"] = sql  # run by name once prepared: psycopg keeps no text
                return fetch(wrapped)
        except NotSupportedError as exc:
            if (last or connection.in_atomic_block
                    or getattr(exc.__cause__, "sqlstate", None) != _PLAN_CHANGED):
                raise
            connection.connection.execute("DEALLOCATE ALL")  # psycopg forgets them too
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _Plan(Generic[M]):
    model: type[M]
    db: str
    sql: str
    params: tuple[Any, ...]
    slot: int  # the looked-up value's place in ``params``
    start: int  # the model's own columns: row[start:end], named by init_list
    end: int
    init_list: list[str]
    related: list[Any]  # Django's RelatedPopulator, one per select_related object
    annotations: dict[str, int]  # attribute -> column
    converters: dict[int, tuple[list[Any], Any]]  # column -> (converters, expression)


class CompiledGet(Generic[M]):
    """``build(value)``, a query that finds at most one ``M`` by ``value``, compiled once
    (``marker``, a value of the same type found nowhere else in the query, stands for it then);
    ``get(value)`` is that query's ``get()`` without the ORM's work."""

    def __init__(self, build: Callable[[Any], QuerySet[M]], marker: Any) -> None:
        self.build, self.marker = build, marker

    @cached_property
    def plan(self) -> _Plan[M]:
        queryset = self.build(self.marker).order_by()  # as get() does: one row is found
        compiler = queryset.query.get_compiler(using=queryset.db)
        sql, params = compiler.as_sql()
        slots = [i for i, p in enumerate(params) if p == self.marker]
        assert len(slots) == 1, f"the marker must be one parameter of the query, not {slots}"
        select, klass_info = compiler.select, compiler.klass_info
        assert klass_info is not None
        fields = klass_info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        return _Plan(
            model=queryset.model, db=queryset.db, sql=sql, params=tuple(params), slot=slots[0],
            start=start, end=end,
            init_list=[f[0].target.attname for f in select[start:end]],
            related=get_related_populators(klass_info, select, queryset.db),
            annotations=dict(compiler.annotation_col_map),
            converters=compiler.get_converters([s[0] for s in select[:compiler.col_count]]))

    def get(self, value: Any) -> M:
        plan = self.plan
        params = list(plan.params)
        params[plan.slot] = value
        connection = connections[plan.db]
        rows = run_prepared(connection, plan.sql, params, lambda cursor: cursor.fetchmany(2))
        if len(rows) != 1:
            model = plan.model
            if not rows:
                raise model.DoesNotExist(f"{model.__name__} matching query does not exist.")
            raise model.MultipleObjectsReturned(f"more than one {model.__name__} found")
        row = list(rows[0])
        for column, (converters, expression) in plan.converters.items():
            for converter in converters:
                row[column] = converter(row[column], expression, connection)
        obj = plan.model.from_db(plan.db, plan.init_list, row[plan.start:plan.end])
        for populator in plan.related:
            populator.populate(row, obj)
        for name, column in plan.annotations.items():
            setattr(obj, name, row[column])
        return obj
