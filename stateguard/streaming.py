"""``guard.stream`` / ``guard.astream``: a guarded run, streamed, with the saga's events beside
LangGraph's stream modes.

``stream_mode`` takes LangGraph's modes and one more, ``"saga"``: the run's ``Event``s (steps
started and finished, invariants, compensations and their attempts, approvals, the run's
status), each yielded before the LangGraph chunk that follows it, and those of an unwind after
the last chunk, before ``SagaAborted`` is raised. The shapes are LangGraph's: one mode (a
string) yields bare chunks, a list yields ``(mode, chunk)`` pairs (``(namespace, mode, chunk)``
with ``subgraphs=True``, the saga's events under the namespace ``()``)::

    for mode, chunk in guard.stream(graph, input, config, stream_mode=["updates", "saga"]):
        ...

Everything else is ``invoke``'s: a new turn, the lease, the final check, the unwind and its
report. A consumer that stops iterating leaves the run as a cancelled ``ainvoke`` does:
``running``, its lease released, the step in doubt for ``recover``.
"""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command

from stateguard.events import Event
from stateguard.exceptions import ConfigurationError, SagaAborted
from stateguard.runner import GuardRunner, paused_tasks, runner_config

__all__ = ["SAGA", "GuardStreaming"]

SAGA = "saga"
Graph = Pregel[Any, Any, Any, Any]


class _Modes:
    """What was asked for: LangGraph's modes (None: the graph's default), whether the saga's
    events too, and the shape of what is yielded."""

    def __init__(self, stream_mode: str | Sequence[str] | None, subgraphs: bool) -> None:
        if stream_mode is not None and not isinstance(stream_mode, (str, list, tuple)):
            raise ConfigurationError("stream_mode must be a mode or a list of modes")
        asked = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode or [])
        self.saga = SAGA in asked
        self.single = not isinstance(stream_mode, (list, tuple))
        graph_modes = [m for m in asked if m != SAGA]
        self.only_saga = self.saga and not graph_modes
        self.graph_modes: str | list[str] | None = (
            None if stream_mode is None else
            ["updates"] if self.only_saga else
            graph_modes[0] if self.single else graph_modes)
        self.subgraphs = subgraphs

    def kwargs(self) -> dict[str, Any]:
        return {} if self.graph_modes is None else {"stream_mode": self.graph_modes}

    def event(self, event: Event) -> Any:
        if self.single:
            return event
        return ((), SAGA, event) if self.subgraphs else (SAGA, event)


def _drained(events: queue.SimpleQueue[Event] | None, modes: _Modes) -> list[Any]:
    out: list[Any] = []
    while events is not None:
        try:
            out.append(modes.event(events.get_nowait()))
        except queue.Empty:
            break
    return out


class GuardStreaming(GuardRunner):
    def _listening(self, run_id: str, modes: _Modes
                   ) -> AbstractContextManager[queue.SimpleQueue[Event] | None]:
        # Events are built only for a listener (the hot path): listen only when asked to.
        return self.core.listening(run_id) if modes.saga else nullcontext()

    def stream(self, graph: Graph, input: Any, config: RunnableConfig, *,
               stream_mode: str | Sequence[str] | None = None, **kwargs: Any) -> Iterator[Any]:
        """``invoke``, streamed (``stateguard.streaming``)."""
        modes = _Modes(stream_mode, bool(kwargs.get("subgraphs")))
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id), self._listening(run_id, modes) as events:
            paused = (paused_tasks(graph.get_state(config)) if isinstance(input, Command)
                      else set())
            self._start(run_id, config, input, paused)
            run_config = runner_config(config)
            failure: Exception | None = None
            try:
                for chunk in graph.stream(input, run_config, durability="sync",
                                          **modes.kwargs(), **kwargs):
                    yield from _drained(events, modes)
                    if not modes.only_saga:
                        yield chunk
            except Exception as exc:
                failure = exc
            if failure is not None:
                report = self.unwind_failed(graph, run_config, failure)
                yield from _drained(events, modes)
                if report is None:
                    raise failure
                raise SagaAborted(failure, report) from failure
            snapshot = graph.get_state(run_config)
            violation = self.settle(run_config, snapshot.next, snapshot.values)
            if violation is not None:
                report = self.unwind_violation(graph, run_config, violation, snapshot.values)
                yield from _drained(events, modes)
                raise SagaAborted(violation, report) from violation
            yield from _drained(events, modes)

    async def astream(self, graph: Graph, input: Any, config: RunnableConfig, *,
                      stream_mode: str | Sequence[str] | None = None, **kwargs: Any
                      ) -> AsyncIterator[Any]:
        """``ainvoke``, streamed (``stateguard.streaming``)."""
        modes = _Modes(stream_mode, bool(kwargs.get("subgraphs")))
        run_id = self._begin(graph, input, config, kwargs)
        with self.core.lease(run_id), self._listening(run_id, modes) as events:
            paused = (paused_tasks(await graph.aget_state(config)) if isinstance(input, Command)
                      else set())
            self._start(run_id, config, input, paused)
            run_config = runner_config(config)
            failure: Exception | None = None
            try:
                async for chunk in graph.astream(input, run_config, durability="sync",
                                                 **modes.kwargs(), **kwargs):
                    for event in _drained(events, modes):
                        yield event
                    if not modes.only_saga:
                        yield chunk
            except Exception as exc:
                failure = exc
            if failure is not None:
                report = await self.aunwind_failed(graph, run_config, failure)
                for event in _drained(events, modes):
                    yield event
                if report is None:
                    raise failure
                raise SagaAborted(failure, report) from failure
            snapshot = await graph.aget_state(run_config)
            violation = self.settle(run_config, snapshot.next, snapshot.values)
            if violation is not None:
                report = await self.aunwind_violation(graph, run_config, violation,
                                                      snapshot.values)
                for event in _drained(events, modes):
                    yield event
                raise SagaAborted(violation, report) from violation
            for event in _drained(events, modes):
                yield event
