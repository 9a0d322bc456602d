"""``JournalingPostgresSaver``: LangGraph's ``PostgresSaver`` that fences every write of a run
this process holds the lease on, and sends the journal's deferred step rows (see ``step_rows``) in
the pipeline of those writes. PostgreSQL runs a pipeline as one transaction: a fenced-out worker
writes nothing, and a step row commits with the task writes that record the same step.

Every write of a leased run is fenced, the checkpoint ``put`` too, though it may carry no row:
under sync durability LangGraph waits for each checkpoint before the next superstep, so a refused
checkpoint is what stops a worker that lost its lease before its next node, while a refused
``put_writes`` only surfaces when the graph ends. A checkpoint names the token in its metadata and
a trigger checks it (migration 0006): no statement of its own. Task writes have no such field,
so ``put_writes`` sends ``sagas_journal`` (the fence, and the rows it carries, if any).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.postgres import PostgresSaver

from stateguard_web.sagas import events
from stateguard_web.sagas.journal.django_journal import DjangoJournal, LeaseLost, is_fenced_out
from stateguard_web.sagas.journal.step_rows import FENCE_KEY


class JournalingPostgresSaver(PostgresSaver):
    def __init__(self, conn: Any, journal: DjangoJournal) -> None:
        super().__init__(conn)
        self.journal = journal
        # Without the trigger, checkpoints would be written unfenced, and nothing would say so.
        with self._cursor() as cur:
            cur.execute("SELECT 1 FROM pg_trigger WHERE tgname = 'sagas_checkpoint_fence'")
            if cur.fetchone() is None:
                raise ImproperlyConfigured("the database lacks the checkpoint fence (migration "
                                           "sagas 0006): run `manage.py migrate` first")
        self._writing = threading.local()  # the run whose write is in progress on this thread

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        token = self.journal.fencing_token(str(config["configurable"]["thread_id"]))
        if token is not None:
            metadata = {**metadata, FENCE_KEY: token}  # type: ignore[typeddict-unknown-key]
        with self._for_run(config, fenced=token is not None):
            return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        with self._for_run(config, fenced=False):
            super().put_writes(config, writes, task_id, task_path)

    @contextmanager
    def _for_run(self, config: RunnableConfig, *, fenced: bool) -> Iterator[None]:
        """Mark this thread's write as one for the run; ``fenced``: its rows fence themselves
        (a checkpoint: the trigger), so it sends a statement only to carry step rows."""
        run_id = str(config["configurable"]["thread_id"])
        self._writing.run_id, self._writing.fenced = run_id, fenced
        try:
            yield
        except psycopg.Error as exc:
            if is_fenced_out(exc):
                raise LeaseLost(run_id) from exc
            raise
        finally:
            self._writing.run_id = None

    @contextmanager
    def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
        run_id = getattr(self._writing, "run_id", None) if pipeline else None
        taken = None
        # Held from before the transaction begins (its checkpoint row takes the run's row lock
        # through the fence, which a flush waiting on this lock may want) until the rows it
        # takes committed or went back: no other write of the run takes rows meanwhile.
        with self.journal.rows_in_order(run_id) if run_id is not None else nullcontext():
            try:
                with super()._cursor(pipeline=pipeline) as cur:
                    yield cur
                    pending = (self.journal.take_pending(run_id, fence=not self._writing.fenced)
                               if run_id is not None else None)
                    if pending is not None:
                        statement, taken = pending
                        cur.execute(*statement)
            except BaseException as exc:
                # The rows did not commit. Unless the run is no longer ours, they wait for the
                # next write: a body that ran stays journaled, late rather than never.
                if run_id is not None and taken is not None and not is_fenced_out(exc):
                    self.journal.give_back(run_id, taken)
                raise
        if taken is not None:
            events.committed()  # the live updates about these rows may go
