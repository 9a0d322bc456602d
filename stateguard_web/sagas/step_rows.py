"""Step rows written with LangGraph's own checkpoint writes (PostgreSQL).

Writing "step started" and "step finished" as statements of their own cost two commits per step,
more than the whole LangGraph run they journal (docs/benchmarks.md, P2). Instead the journal keeps
them here, and ``JournalingPostgresSaver`` sends them, fenced, in the same pipeline, hence the
same transaction, as the checkpoint writes that follow: the task's writes when it finishes, the
next checkpoint before the next superstep. A step's row and its writes commit or vanish together.
A run's move from pending to running travels the same way, with the first checkpoint.

What a crash loses is the row of a step whose body was running. LangGraph's last checkpoint still
lists that step as a pending task with no writes, and the runner journals such tasks as in doubt
before anyone resumes or unwinds the run (``GuardRunner`` with a ``defers_steps`` journal).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from psycopg.types.json import Jsonb

from stateguard import ErrorInfo, RunStatus, StepStatus
from stateguard.records import json_default

_dumps = partial(json.dumps, default=json_default)
FENCE_SQLSTATE = "SG001"  # raised by sagas_journal() (migration 0003): the lease was taken over
# One statement per checkpoint write: the fence, a deferred status and the step rows.
JOURNAL = "SELECT sagas_journal(%s, %s::bigint, %s, %s)"


@dataclass
class _Row:
    step_id: str
    node: str
    tags: tuple[str, ...]
    started_at: datetime
    new: bool = True  # not written yet as started
    status: StepStatus = StepStatus.STARTED
    finished_at: datetime | None = None
    outcome: dict[str, Any] = field(default_factory=dict)  # update, state_after, error

    def as_json(self) -> dict[str, Any]:
        error: ErrorInfo | None = self.outcome.get("error")
        return {"step_id": self.step_id, "node": self.node, "tags": list(self.tags),
                "status": self.status.value, "started_at": self.started_at.isoformat(),
                "finished_at": self.finished_at.isoformat() if self.finished_at else None,
                "update": self.outcome.get("update"),
                "state_after": self.outcome.get("state_after"),
                "error": error.to_dict() if error else None,
                "effect": self.status in (StepStatus.SUCCEEDED, StepStatus.VIOLATED),
                "new": self.new}


class StepBuffer:
    """Step rows not written yet, per run. Node wrappers add to it from LangGraph's worker
    threads while the saver drains it from its own: one lock guards it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, _Row]] = {}
        self._status: dict[str, RunStatus] = {}  # a status change that can wait, per run

    def set_status(self, run_id: str, status: RunStatus) -> None:
        with self._lock:
            self._status[run_id] = status

    def drop_status(self, run_id: str) -> None:
        with self._lock:
            self._status.pop(run_id, None)

    def start(self, run_id: str, step_id: str, node: str, tags: tuple[str, ...],
              at: datetime) -> None:
        with self._lock:
            self._runs.setdefault(run_id, {})[step_id] = _Row(step_id, node, tags, at)

    def finish(self, run_id: str, step_id: str, status: StepStatus, at: datetime,
               **outcome: Any) -> bool:
        """Record the outcome of a step started through this buffer; False if it was not."""
        with self._lock:
            row = self._runs.get(run_id, {}).get(step_id)
            if row is None:
                return False
            row.status, row.finished_at, row.outcome = status, at, outcome
            return True

    def drain(self, run_id: str) -> tuple[RunStatus | None, Jsonb | None]:
        """The run's pending status and step rows, as ``sagas_journal`` takes them. Rows of
        steps still running stay here (as written), so that their outcome can follow."""
        with self._lock:
            status = self._status.pop(run_id, None)
            rows = self._runs.get(run_id)
            if not rows:
                return status, None
            steps = [row.as_json() for row in rows.values()
                     if row.new or row.finished_at is not None]
            for step_id, row in list(rows.items()):
                if row.finished_at is not None:
                    del rows[step_id]
                else:
                    row.new = False
            if not rows:
                del self._runs[run_id]
            return status, Jsonb(steps, dumps=_dumps) if steps else None

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            self._status.pop(run_id, None)
