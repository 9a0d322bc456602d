"""Node instrumentation: how StateGuard sees and enforces a LangGraph run, in both forms.

Each node of the compiled graph is wrapped so that, around the node body, in every durability mode:
1. an approval gate pauses the run *before* the body (``interrupt()`` re-runs the whole node on
   resume, so gating inside the body would repeat its effect);
2. invariants are checked on the input state (catching the combined writes of parallel nodes);
3. a "step started" row is journaled, so a crash leaves a visible in-doubt step;
4. the body runs, each ``@task`` it calls a step of its own (``stateguard.functional``) (a
   body that pauses itself with ``interrupt()`` is journaled paused: it runs again, from its
   start, on resume);
5. invariants are checked on ``state + update`` computed with the graph's reducers; a violation
   raises ``InvariantViolation`` (a ``RuntimeError``, which LangGraph neither retries nor applies).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph._internal._runnable import RunnableCallable
from langgraph.constants import START
from langgraph.pregel import Pregel

from stateguard.approvals import approval_gate
from stateguard.blame import bubbled_up, from_the_store, tag_node
from stateguard.effects import recording
from stateguard.events import Event, emit
from stateguard.exceptions import ConfigurationError, InvariantViolation
from stateguard.faults import fault_point
from stateguard.functional import guarding_calls, tasks_of
from stateguard.kinds import (
    StepKind,
    kind_keywords,
    reachable_only_after,
    refusal_after_pivot,
    retry_delay,
)
from stateguard.records import ErrorInfo, StepStatus
from stateguard.state import apply_update, as_dict, update_of
from stateguard.subgraphs import mark_subgraphs
from stateguard.tools import install, subgraph_tool_nodes, tool_nodes, tools_of

if TYPE_CHECKING:
    from stateguard.core import GuardCore
    from stateguard.spec import GuardSpec

# Marks a run driven by the guard's runner (guard.invoke & co.), which settles its turn itself
# (stateguard.plain_runs settles the turns of a plain graph.invoke).
RUNNER_KEY = "__stateguard_runner"
_TASK_ID_KEY = "__pregel_task_id"
_READ_STATE_KEY = "__pregel_read_state"


def node_tags(metadata: Mapping[str, Any] | None) -> tuple[str, ...]:
    tags = (metadata or {}).get("tags", ())
    return (tags,) if isinstance(tags, str) else tuple(str(t) for t in tags)


# One graph is wrapped once, even when two threads start its first runs at the same moment.
_instrumenting = threading.Lock()


def instrument_graph(graph: Pregel[Any, Any, Any, Any], core: GuardCore) -> None:
    """Wrap every node of the compiled ``graph`` in place (once; a graph already wrapped is left
    as it is): ``guard.compile(builder)`` does it at once, ``builder.compile(checkpointer=guard)``
    when the guard first sees the graph run. Both forms then meet every LangGraph feature
    (error handlers, durability modes, ``Send``, time travel) through the same wrappers.

    A node is replaced by a copy (``PregelNode.copy``) whose ``bound`` runnable is the wrapper
    around the old one; its writers, triggers, retry and error-handler settings are kept."""
    with _instrumenting:
        if is_instrumented(graph):
            return
        nodes = {name: node for name, node in graph.nodes.items() if name != START}
        runnables = {name: node.bound for name, node in nodes.items()}
        tags = mark_subgraphs(core.spec, {name: node_tags(node.metadata)
                                          for name, node in nodes.items()}, runnables)
        with_tools = tool_nodes(runnables)
        nested = subgraph_tool_nodes(runnables)  # a subgraph's tool calls are steps too
        all_tools = {**with_tools, **{path: node for path, (node, _) in nested.items()}}
        core.spec.validate_names(tags, tools_of(all_tools), tasks_of(runnables))
        check_order(core.spec, graph, tags, with_tools)
        for tool_node in with_tools.values():
            install(tool_node, graph.channels)  # tool calls are steps (stateguard.tools)
        for tool_node, channels in nested.values():
            install(tool_node, channels)
        for name, node in nodes.items():
            wrapper = _NodeWrapper(name, tags[name], node.bound, core, graph.channels)
            runnable = RunnableCallable(wrapper.run, wrapper.arun, name=name, trace=False,
                                        recurse=False)
            runnable.stateguard_wrapper = wrapper  # type: ignore[attr-defined]
            graph.nodes[name] = node.copy({"bound": runnable})


def check_order(spec: GuardSpec, graph: Pregel[Any, Any, Any, Any],
                tags: Mapping[str, tuple[str, ...]], with_tools: Mapping[str, Any]) -> None:
    """Refuse a graph in which a node with a compensation (or a ``ToolNode`` with a
    compensatable tool) can run only after a pivot node: its effect could never be undone."""
    pivots = {n for n, t in tags.items() if spec.kind_for(n, t) == StepKind.PIVOT}
    builder = getattr(graph, "builder", None)
    if not pivots or builder is None:
        return
    tools = tools_of(with_tools)

    def undoable(node: str) -> bool:
        if spec.kind_for(node, tags[node]) == StepKind.COMPENSATABLE and spec.compensation_for(
                node, tags[node]) is not None:
            return True
        calls = tools_of({node: with_tools[node]}) if node in with_tools else {}
        return any(spec.kind_for(t, tools[t]) == StepKind.COMPENSATABLE
                   and spec.compensation_for(t, tools[t]) is not None for t in calls)

    after = sorted(n for n in reachable_only_after(builder, pivots) if n in tags and undoable(n))
    if after:
        raise ConfigurationError(
            f"{after} can run only after the pivot {sorted(pivots)} (the point of no return) "
            "and have compensations that would never run: make them retriable (kinds), or "
            "move them before the pivot")


def is_instrumented(graph: Pregel[Any, Any, Any, Any]) -> bool:
    return any(wrapped_node(node.bound) is not None for node in graph.nodes.values())


def wrapped_node(runnable: Any) -> Any:
    """The runnable a node wrapper wraps (``None`` if ``runnable`` is no wrapper)."""
    wrapper = getattr(runnable, "stateguard_wrapper", None)
    return wrapper.inner if isinstance(wrapper, _NodeWrapper) else None


class _NodeWrapper:
    def __init__(self, name: str, tags: tuple[str, ...], inner: Any, core: GuardCore,
                 channels: Mapping[str, Any]) -> None:
        self.name, self.tags, self.inner, self.core, self.channels = (
            name, tags, inner, core, channels)
        self.approval = core.spec.approvals.get(name, False)
        self.kind = core.spec.kind_for(name, tags)
        self.retry = core.spec.retry_for(name, tags)

    def run(self, state: Any, config: RunnableConfig) -> Any:
        run_id, step_id, values = self._before(state, config)
        attempt = 1
        while True:  # more than once for a retriable step only (stateguard.kinds)
            try:
                with recording(self.core.journal, run_id, step_id, self.name), \
                        guarding_calls(self.core, run_id, step_id, config) as guarded:
                    fault_point(self.core, "before", run_id, step_id, self.name, "node", attempt)
                    result = self.inner.invoke(state, guarded)
                    fault_point(self.core, "after", run_id, step_id, self.name, "node", attempt)
            except BaseException as exc:
                self._failed(run_id, step_id, exc)
                delay = retry_delay(self.retry, exc, attempt)
                if delay is None:
                    raise
                time.sleep(delay)
                attempt += 1
                self._start(run_id, step_id)
                continue
            return self._after(run_id, step_id, values, result)

    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        run_id, step_id, values = self._before(state, config)
        attempt = 1
        while True:
            try:
                with recording(self.core.journal, run_id, step_id, self.name), \
                        guarding_calls(self.core, run_id, step_id, config) as guarded:
                    fault_point(self.core, "before", run_id, step_id, self.name, "node", attempt)
                    result = await self.inner.ainvoke(state, guarded)
                    fault_point(self.core, "after", run_id, step_id, self.name, "node", attempt)
            except BaseException as exc:
                self._failed(run_id, step_id, exc)
                delay = retry_delay(self.retry, exc, attempt)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt += 1
                self._start(run_id, step_id)
                continue
            return self._after(run_id, step_id, values, result)

    def _before(self, state: Any, config: RunnableConfig) -> tuple[str, str, dict[str, Any]]:
        conf = config.get("configurable", {})
        run_id, step_id = str(conf["thread_id"]), str(conf[_TASK_ID_KEY])
        core = self.core
        core.check_stop(run_id, self.name)  # a step boundary: before the gate, too
        values = _graph_state(state, conf)
        if self.approval is not False:
            self._gate(run_id, step_id, values)
        found = core.spec.first_violation(values)
        if found is not None:
            exc = InvariantViolation(found[0].name, found[1], node=self.name, phase="before")
            emit(core.on_event, Event("invariant.violated", run_id, self.name, step_id,
                                      {"invariant": found[0].name, "message": found[1],
                                       "phase": "before"}))
            tag_node(exc, self.name)
            raise exc
        refused = refusal_after_pivot(core, run_id, self.name, self.tags, self.kind)
        if refused is not None:
            raise tag_node(refused, self.name)
        self._start(run_id, step_id)
        return run_id, step_id, values

    def _start(self, run_id: str, step_id: str) -> None:
        """Journal the step as started (again, for each attempt of a retriable step)."""
        core = self.core
        core.check_lease(run_id)
        core.check_stop(run_id, self.name)  # a retriable step's next attempt, too
        core.histories.restart(run_id, step_id)
        with from_the_store():
            _, previous = core.journal.step_start(run_id, step_id, self.name, self.tags,
                                                  **kind_keywords(self.kind))
        if core.on_event is not None:  # the hot path: build events only for a listener
            emit(core.on_event, Event("step.started", run_id, self.name, step_id,
                                      {"in_doubt_rerun": previous == StepStatus.STARTED}))

    def _gate(self, run_id: str, step_id: str, values: dict[str, Any]) -> None:
        predicate = self.approval
        if callable(predicate) and not predicate(values):
            return
        approval_gate(self.core, run_id, step_id, self.name, {"node": self.name, "state": values})

    def _failed(self, run_id: str, step_id: str, exc: BaseException) -> None:
        bubbled = bubbled_up(exc)
        if bubbled is not None:
            with from_the_store():
                self.core.journal.step_finish(run_id, step_id, bubbled[0], error=bubbled[1])
            return
        if not isinstance(exc, Exception):
            # Cancelled (a parallel sibling failed, under asyncio) or interrupted mid-body: the
            # effect may or may not have happened. The step stays "started", in doubt.
            return
        error = ErrorInfo.from_exception(exc)
        tag_node(exc, self.name)
        with from_the_store():
            self.core.journal.step_finish(run_id, step_id, StepStatus.FAILED, error=error)
        emit(self.core.on_event, Event("step.failed", run_id, self.name, step_id,
                                       {"error": str(error)}))

    def _after(self, run_id: str, step_id: str, values: dict[str, Any], result: Any) -> Any:
        core = self.core
        try:
            update = update_of(result)
            after = apply_update(self.channels, values, update)
        except Exception as bad_result:
            # The body ran (its effect happened) but its result cannot be applied: journal it
            # as a step to compensate, then fail the run.
            with from_the_store():
                core.journal.step_finish(run_id, step_id, StepStatus.VIOLATED,
                                         update=repr(result), state_after=values,
                                         error=ErrorInfo.from_exception(bad_result))
            raise tag_node(bad_result, self.name) from None
        found = core.spec.first_violation(after)
        state = core.histories.encode(run_id, step_id, values, after, update=update)
        if found is None:
            with from_the_store():
                core.journal.step_finish(run_id, step_id, StepStatus.SUCCEEDED, update=update,
                                         state_after=state.state)
            core.histories.keep(run_id, step_id, state)
            if core.on_event is not None:
                emit(core.on_event, Event("step.succeeded", run_id, self.name, step_id))
            return result
        invariant, message = found
        exc = InvariantViolation(invariant.name, message, node=self.name)
        # The body ran, so its effect happened: journal it as a step to compensate.
        with from_the_store():
            core.journal.step_finish(run_id, step_id, StepStatus.VIOLATED, update=update,
                                     state_after=state.state,
                                     error=ErrorInfo.from_exception(exc))
        emit(core.on_event, Event("invariant.violated", run_id, self.name, step_id,
                                  {"invariant": invariant.name, "message": message}))
        raise tag_node(exc, self.name)


def _graph_state(state: Any, conf: Mapping[str, Any]) -> dict[str, Any]:
    """The graph's state as this node sees it. A ``Send`` task's input is the ``Send``'s
    payload (v2 agents send a tool call), not the state invariants and compensations are
    written for; LangGraph gives only ``Send`` tasks a reader of the state the node would get
    from an edge (the internal ``__pregel_read_state``)."""
    read_state = conf.get(_READ_STATE_KEY)
    if callable(read_state):
        try:
            return as_dict(read_state())
        except Exception:  # LangGraph's reader moved: judge the payload, as before
            pass
    return as_dict(state)
