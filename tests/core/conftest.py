"""Fixtures shared by the core tests."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from stateguard import InMemoryJournal, SqliteJournal


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
