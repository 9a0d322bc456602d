"""Fixtures shared by the core tests."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from psycopg.conninfo import make_conninfo

from stateguard import InMemoryJournal, SqliteJournal
from stateguard.postgres_journal import PostgresJournal

# The PostgreSQL server of the tests: STATEGUARD_TEST_DATABASE_URL's (the web tests' database
# there is left alone: only its server is used), else STATEGUARD_TEST_PG, else the local one.
PG_ADMIN = make_conninfo(os.environ.get("STATEGUARD_TEST_DATABASE_URL")
                         or os.environ.get("STATEGUARD_TEST_PG")
                         or "postgresql://postgres@127.0.0.1:5432/postgres", dbname="postgres")


def pg_database(prefix: str) -> Iterator[str]:
    """A throwaway database on the tests' server, named ``prefix`` and a random part (several
    pytest-xdist workers, and several checkouts' suites, share the server); its conninfo."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(PG_ADMIN, dbname=name)
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """A throwaway database on the tests' PostgreSQL server."""
    yield from pg_database("stateguard_test")


@pytest.fixture(scope="session")
def pg_journal_db() -> Iterator[str]:
    """One database per pytest-xdist worker for the PostgresJournal tests, each test in a
    schema of its own (``pg_schema``): a schema costs milliseconds, a database a second."""
    yield from pg_database(f"stateguard_pgj_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")


@pytest.fixture
def pg_schema(pg_journal_db: str) -> Iterator[str]:
    """A schema of this test's own in ``pg_journal_db``, dropped after it with what it holds."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        with psycopg.connect(pg_journal_db, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_journal(pg_journal_db: str, pg_schema: str) -> Iterator[PostgresJournal]:
    """A ``PostgresJournal`` set up in a schema of this test's own."""
    with PostgresJournal(pg_journal_db, schema=pg_schema, max_connections=4) as journal:
        journal.setup()
        yield journal


@pytest.fixture(params=["memory", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A saver and a journal: both in memory, or both in SQLite files (a real saver)."""
    if request.param == "memory":
        yield {"saver": InMemorySaver(), "journal": InMemoryJournal()}
        return
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    try:
        yield {"saver": SqliteSaver(conn), "journal": SqliteJournal(tmp_path / "journal.db")}
    finally:
        conn.close()


@pytest.fixture
def saver(stores: dict[str, Any]) -> Any:
    """An in-memory or a SQLite saver (with the default journal)."""
    return stores["saver"]
