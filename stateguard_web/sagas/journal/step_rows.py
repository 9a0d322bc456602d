"""Step rows written with LangGraph's own checkpoint writes (PostgreSQL).

Writing "step started" and "step finished" as statements of their own cost two commits per step,
more than the whole LangGraph run they journal (docs/benchmarks.md, P2). Instead the journal keeps
them here, and ``JournalingPostgresSaver`` sends them, fenced, in the same pipeline, hence the
same transaction, as the checkpoint writes that follow: the task's writes when it finishes, the
next checkpoint before the next superstep. A step's row commits with the write that carries it;
if that write fails, the row waits for the next one (a body that ran is journaled late rather
than never). A run's move from pending to running travels the same way, with the first
checkpoint. Only a run's first run defers (``DjangoJournal``): a resumed run writes at once.

What a crash loses is the row of a step whose body was running. LangGraph's last checkpoint still
lists that step as a pending task with no writes, and the runner journals such tasks as in doubt
before anyone resumes or unwinds the run (``GuardRunner`` with a ``defers_steps`` journal).
A ``@task`` call or a tool call is no task of the checkpoint (it runs inside one), so its start
is not deferred (``DjangoJournal``).
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
from stateguard.records import EFFECT_STATUSES, json_default

_dumps = partial(json.dumps, default=json_default)
FENCE_SQLSTATE = "SG001"  # raised by sagas_fence() (migration 0006): the lease was taken over
# One statement per checkpoint write: the fence, a deferred status and the step rows.
JOURNAL = "SELECT sagas_journal(%s, %s::bigint, %s, %s)"
# The checkpoint metadata key naming its writer's fencing token: a trigger fences the row on it
# (migration 0006), so a checkpoint needs no journal statement unless it carries rows.
FENCE_KEY = "stateguard_fencing_token"


@dataclass
class _Row:
    step_id: str
    node: str
    tags: tuple[str, ...]
    started_at: datetime
    kind: str = "compensatable"  # stateguard.kinds
    new: bool = True  # not written yet as started
    status: StepStatus = StepStatus.STARTED
    finished_at: datetime | None = None
    outcome: dict[str, Any] = field(default_factory=dict)  # update, state_after, error

    def as_json(self) -> dict[str, Any]:
        """The row as ``sagas_journal`` takes it (a JSON object of the array it loops over)."""
        error: ErrorInfo | None = self.outcome.get("error")
        return {"step_id": self.step_id, "node": self.node, "tags": list(self.tags),
                "status": self.status.value, "started_at": self.started_at.isoformat(),
                "finished_at": self.finished_at.isoformat() if self.finished_at else None,
                "update": self.outcome.get("update"),
                "state_after": self.outcome.get("state_after"),
                "error": error.to_dict() if error else None,
                "effect": self.status in EFFECT_STATUSES, "kind": self.kind,
                "new": self.new}


@dataclass
class Taken:
    """What one write carries for a run; handed back if that write fails."""

    status: RunStatus | None
    finished: list[_Row]
    starts: list[_Row]  # rows of running steps whose start this write carries
    steps: list[dict[str, Any]]  # the rows as written, taken under the buffer's lock

    def params(self) -> tuple[RunStatus | None, Jsonb | None]:
        return self.status, Jsonb(self.steps, dumps=_dumps) if self.steps else None


class StepBuffer:
    """Step rows not written yet, per run, in the order they happened. Node wrappers add to it
    from LangGraph's worker threads while the saver takes from it on its own: one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[str, list[_Row]] = {}  # finished, not written yet, in finish order
        self._running: dict[str, dict[str, _Row]] = {}  # started, not finished
        self._status: dict[str, RunStatus] = {}  # a status change that can wait, per run

    def set_status(self, run_id: str, status: RunStatus) -> None:
        with self._lock:
            self._status[run_id] = status

    def drop_status(self, run_id: str) -> None:
        with self._lock:
            self._status.pop(run_id, None)

    def start(self, run_id: str, step_id: str, node: str, tags: tuple[str, ...],
              at: datetime, *, kind: str = "compensatable") -> None:
        with self._lock:
            self._running.setdefault(run_id, {})[step_id] = _Row(step_id, node, tags, at,
                                                                 kind)

    def finish(self, run_id: str, step_id: str, status: StepStatus, at: datetime,
               **outcome: Any) -> bool:
        """Record the outcome of a step started through this buffer; False if it was not. A
        step run again at once (LangGraph's RetryPolicy) keeps its failed attempt: each
        finished attempt is a row of its own, written in order."""
        with self._lock:
            row = self._running.get(run_id, {}).pop(step_id, None)
            if row is None:
                return False
            row.status, row.finished_at, row.outcome = status, at, outcome
            self._done.setdefault(run_id, []).append(row)
            return True

    def take(self, run_id: str) -> Taken | None:
        """What the next write for the run carries: its pending status, the finished rows and
        the starts of running steps not written yet (their outcome follows later)."""
        with self._lock:
            status, finished = self._status.pop(run_id, None), self._done.pop(run_id, [])
            starts = [row for row in self._running.get(run_id, {}).values() if row.new]
            if status is None and not finished and not starts:
                return None
            # every finished row before the starts of steps still running: as it happened
            taken = Taken(status, finished, starts, [r.as_json() for r in finished + starts])
            for row in starts:
                row.new = False
            return taken

    def give_back(self, run_id: str, taken: Taken) -> None:
        """The write that carried ``taken`` failed: its rows wait for the next one, before what
        came since (a body that ran must stay journaled, even if late)."""
        with self._lock:
            for row in taken.starts:
                row.new = True  # whether still running or finished since
            self._done[run_id] = taken.finished + self._done.get(run_id, [])
            if taken.status is not None:
                self._status.setdefault(run_id, taken.status)

    def holds(self, run_id: str) -> bool:
        """Whether something of the run waits for a write: a status, a row, a start."""
        with self._lock:
            return (run_id in self._status or bool(self._done.get(run_id))
                    or any(row.new for row in self._running.get(run_id, {}).values()))

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._done.pop(run_id, None)
            self._running.pop(run_id, None)
            self._status.pop(run_id, None)
