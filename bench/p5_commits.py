"""Loaded into P5's Celery worker only (``celery worker --include bench.p5_commits``): records
when each step row's write commits, for ``bench/p5_ws.py``.

A step's row travels with LangGraph's checkpoint writes (``sagas/journal/step_rows.py``): it
commits when ``JournalingPostgresSaver._cursor``'s pipeline ends. This wraps that context manager
and, right after it returns (the commit acknowledged by PostgreSQL), appends ``step_id status
unix_time`` for each finished row the write carried to ``$P5_COMMITS_DIR/commits-<pid>.log``.
Rows written at once on Django's connection (``DjangoJournal._flush``: resumed runs, not the
first run P5 measures) are recorded after that statement, which autocommits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stateguard_web.sagas.journal import checkpoints, django_journal

_DIR = os.environ.get("P5_COMMITS_DIR", "")
_local = threading.local()
_lock = threading.Lock()
_take = django_journal.DjangoJournal.take_pending
_cursor = checkpoints.JournalingPostgresSaver._cursor
_flush = django_journal.DjangoJournal._flush


def _record(taken: Any) -> None:
    now = time.time()
    lines = "".join(f"{row.step_id} {row.status.value} {now:.6f}\n" for row in taken.finished)
    if lines and _DIR:
        with _lock, open(os.path.join(_DIR, f"commits-{os.getpid()}.log"), "a") as out:
            out.write(lines)


def take_pending(self: Any, run_id: str, **kwargs: Any) -> Any:
    pending = _take(self, run_id, **kwargs)
    _local.taken = pending[1] if pending else None
    return pending


@contextmanager
def cursor(self: Any, *, pipeline: bool = False) -> Iterator[Any]:
    _local.taken = None
    with _cursor(self, pipeline=pipeline) as cur:
        yield cur
    taken, _local.taken = getattr(_local, "taken", None), None
    if taken is not None:
        _record(taken)


def flush(self: Any, run_id: str) -> None:
    _local.taken = None
    _flush(self, run_id)
    taken, _local.taken = getattr(_local, "taken", None), None
    if taken is not None:
        _record(taken)


django_journal.DjangoJournal.take_pending = take_pending  # type: ignore[method-assign]
checkpoints.JournalingPostgresSaver._cursor = cursor  # type: ignore[method-assign,assignment]
django_journal.DjangoJournal._flush = flush  # type: ignore[method-assign]
