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

from stateguard import InMemoryJournal, SqliteJournal

PG_ADMIN = os.environ.get("STATEGUARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """A throwaway database on the local PostgreSQL server."""
    name = f"stateguard_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


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
