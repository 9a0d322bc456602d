"""The drop-in path: ``builder.compile(checkpointer=guard)`` with a plain ``graph.invoke``.

Here StateGuard sees the run only through the checkpointer calls LangGraph makes on its background
threads, so it observes rather than instruments:
- ``put_writes`` of a task that finished -> a succeeded step (node from ``task_path``);
- ``put_writes`` carrying ``__error__`` -> the unwind runs right there, before LangGraph re-raises
  the node's exception to the caller (LangGraph waits for these calls before it raises), and the
  exception gets the report as ``exc.stateguard_report`` and as a note;
- ``put`` of a new checkpoint -> invariants are checked on the committed state; a violation
  unwinds and raises ``InvariantViolation``. Under ``durability="sync"`` that stops the run before
  the next node. Under the default ``"async"`` LangGraph does not wait for ``put``, so later nodes
  may already be running: their steps are compensated as soon as they are observed, and
  StateGuard warns once. ``guard.compile(builder)`` enforces in every mode.

LangGraph runs these calls on a thread pool, so a call may overtake an earlier one; each call that
acts on the whole run first waits for the run's calls already in flight.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig

from stateguard.core import GuardCore
from stateguard.exceptions import ConfigurationError, InvalidRunState, InvariantViolation
from stateguard.instrument import INSTRUMENTED_KEY, RUNNER_KEY, node_tags
from stateguard.records import RunStatus, StepStatus
from stateguard.report import UnwindReport
from stateguard.state import apply_update, is_internal_channel, state_values

_ERROR, _INTERRUPT = "__error__", "__interrupt__"
_ABORTED = frozenset({RunStatus.COMPENSATING, RunStatus.COMPENSATED, RunStatus.NEEDS_ATTENTION})
_DRAIN_TIMEOUT = 10.0


class StateGuardWarning(UserWarning):
    """StateGuard is running in a mode where some of its guarantees do not hold."""


def attach_report(exc: BaseException, report: UnwindReport) -> None:
    with contextlib.suppress(AttributeError):  # exceptions with __slots__ only get the note
        exc.stateguard_report = report  # type: ignore[attr-defined]
    exc.add_note(f"StateGuard: {report}")


class DropInObserver:
    def __init__(self, core: GuardCore) -> None:
        self.core = core
        self._cond = threading.Condition()
        self._in_flight: defaultdict[str, int] = defaultdict(int)
        self._values: OrderedDict[str, dict[str, Any]] = OrderedDict()  # checkpoint id -> state
        self._warned = False
        self._graphs: dict[int, tuple[dict[str, tuple[str, ...]], Mapping[str, Any]]] = {}
        # run id -> (node tags, channels) of the graph it runs
        self._runs: dict[str, tuple[dict[str, tuple[str, ...]], Mapping[str, Any]]] = {}
        # Runs whose checkpoint raised a violation: LangGraph saves none of their later
        # checkpoints, so nothing may wait for one.
        self._stopped: set[str] = set()

    @staticmethod
    def mode(config: RunnableConfig) -> str | None:
        """"observe" (drop-in), "errors" (a guarded graph invoked without the guard's runner:
        the wrappers journal steps, this unwinds on a failure), or None (the runner does all)."""
        conf = config.get("configurable", {})
        if conf.get(RUNNER_KEY) or conf.get("checkpoint_ns"):
            return None
        return "errors" if conf.get(INSTRUMENTED_KEY) else "observe"

    # -- run start (from get_tuple, called by LangGraph as a run begins) ----------------------
    def on_run_start(self, config: RunnableConfig) -> None:
        if self.mode(config) != "observe":
            return
        graph = self._starting_graph()
        if graph is None:
            return  # get_state() and other reads, not a run
        run_id = str(config.get("configurable", {}).get("thread_id"))
        self._learn_graph(run_id, graph)
        run = self.core.journal.run_get(run_id)
        if run is not None and run.status in _ABORTED:
            raise InvalidRunState(
                f"run {run_id!r} was unwound ({run.status}); continuing it would run its "
                "nodes only to compensate them: start a new thread_id")
        if self.core.spec.approvals:
            raise ConfigurationError(
                "approval gates need the guarded path: graph = guard.compile(builder)")
        durability = config.get("configurable", {}).get("__pregel_durability", "async")
        if durability != "sync" and not self._warned:
            self._warned = True
            warnings.warn(
                f"StateGuard drop-in mode with durability={durability!r}: node errors are "
                "compensated, but an invariant violation cannot stop nodes that already started "
                "(they are compensated when observed). Use graph = guard.compile(builder), or "
                "invoke with durability='sync', to stop the run before the next node.",
                StateGuardWarning, stacklevel=2)

    @staticmethod
    def _starting_graph() -> Any:
        """The compiled graph whose run is starting, or ``None`` if this is not a run start.

        The checkpointer is never told which graph it serves; LangGraph calls ``get_tuple`` from
        inside ``Pregel.stream``/``astream`` as a run begins, so the graph is the ``self`` of
        that frame a few levels up (``get_state`` reads go through other methods)."""
        from langgraph.pregel import Pregel

        frame = sys._getframe(2)
        for _ in range(40):
            if frame is None:
                return None
            graph = frame.f_locals.get("self")
            if isinstance(graph, Pregel):
                return graph if frame.f_code.co_name in ("stream", "astream") else None
            frame = frame.f_back  # type: ignore[assignment]
        return None

    def _learn_graph(self, run_id: str, graph: Any) -> None:
        """Validate the guard's names against the graph, and keep its tags and reducers for
        this run (several graphs may share one guard)."""
        known = self._graphs.get(id(graph))
        if known is None:
            nodes = {name: node_tags(node.metadata) for name, node in graph.nodes.items()
                     if not name.startswith("__")}
            self.core.spec.validate_names(nodes)
            known = self._graphs[id(graph)] = (nodes, graph.channels)
        self._runs[run_id] = known

    # -- ordering ---------------------------------------------------------------------------
    @contextmanager
    def tracking(self, run_id: str) -> Iterator[None]:
        with self._cond:
            self._in_flight[run_id] += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight[run_id] -= 1
                self._cond.notify_all()

    def _drain(self, run_id: str) -> None:
        """Wait until this call is the run's only observation call still running."""
        with self._cond:
            self._cond.wait_for(lambda: self._in_flight[run_id] <= 1, timeout=_DRAIN_TIMEOUT)

    def _state_of(self, run_id: str, checkpoint_id: str | None) -> dict[str, Any]:
        with self._cond:
            self._cond.wait_for(
                lambda: checkpoint_id in self._values or run_id in self._stopped,
                timeout=_DRAIN_TIMEOUT)
            return dict(self._values.get(checkpoint_id or "", {}))

    # -- observations -----------------------------------------------------------------------
    def after_put(self, config: RunnableConfig, checkpoint: Mapping[str, Any],
                  metadata: Mapping[str, Any]) -> None:
        run_id = str(config["configurable"]["thread_id"])
        values = state_values(checkpoint["channel_values"])
        with self._cond:
            self._values[checkpoint["id"]] = values
            while len(self._values) > 1024:
                self._values.popitem(last=False)
            self._cond.notify_all()
        journal = self.core.journal
        if metadata.get("source") == "input":
            with self._cond:
                self._stopped.discard(run_id)
            journal.run_begin(run_id)
            journal.run_set_status(run_id, RunStatus.RUNNING)
            return
        if int(metadata.get("step", 0)) < 0 or self.mode(config) != "observe":
            return
        found = self.core.spec.first_violation(values)
        if found is None:
            return
        with self._cond:
            self._stopped.add(run_id)
            self._cond.notify_all()
        self._drain(run_id)
        done = [s for s in journal.steps(run_id) if s.done_seq is not None]
        last = max(done, key=lambda s: s.done_seq or 0).node if done else None
        exc = InvariantViolation(found[0].name, found[1], node=last)
        report = self.core.unwind(run_id, self.core.cause_of(exc), fallback_state=values)
        attach_report(exc, report)
        raise exc

    def after_put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                         task_id: str, task_path: str) -> None:
        node = task_path.rsplit(", ", 1)[-1] if task_path.startswith("~__pregel_pull") else ""
        if not node or node.startswith("__") or any(c == _INTERRUPT for c, _ in writes):
            return
        conf = config["configurable"]
        run_id = str(conf["thread_id"])
        node_tags_, channels = self._runs.get(run_id, ({}, {}))
        journal, tags = self.core.journal, node_tags_.get(node, ())
        error = next((v for c, v in writes if c == _ERROR), None)
        observing = self.mode(config) == "observe"  # else the node wrappers journal the steps
        if observing:
            journal.step_start(run_id, task_id, node, tags)
        if error is not None:
            if not isinstance(error, BaseException):
                error = RuntimeError(str(error))
            if observing:
                journal.step_finish(run_id, task_id, StepStatus.FAILED,
                                    error=self.core.cause_of(error).error)
            self._drain(run_id)
            state = self._state_of(run_id, conf.get("checkpoint_id"))
            report = self.core.unwind(run_id, self.core.cause_of(error, failed_node=node),
                                      fallback_state=state)
            attach_report(error, report)
            return
        if not observing:
            return
        update = {c: v for c, v in writes if not is_internal_channel(c)}
        after = apply_update(channels, self._state_of(run_id, conf.get("checkpoint_id")), update)
        journal.step_finish(run_id, task_id, StepStatus.SUCCEEDED, update=update,
                            state_after=after)
        run = journal.run_get(run_id)
        if run is not None and run.status in _ABORTED:
            # Under "async" a node can finish after the run was unwound: undo it too.
            self._drain(run_id)
            self.core.unwind(run_id, self.core.cause_of(None, failed_node=node,
                                                        reason="invariant"))
