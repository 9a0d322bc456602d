"""Node instrumentation: the enforcing half of StateGuard for LangGraph graphs.

Each node of the builder is wrapped so that, around the node body, in every durability mode:
1. an approval gate pauses the run *before* the body (``interrupt()`` re-runs the whole node on
   resume, so gating inside the body would repeat its effect);
2. invariants are checked on the input state (catching the combined writes of parallel nodes);
3. a "step started" row is journaled, so a crash leaves a visible in-doubt step;
4. the body runs (a body that pauses itself with ``interrupt()`` is journaled paused: it runs
   again, from its start, on resume);
5. invariants are checked on ``state + update`` computed with the graph's reducers; a violation
   raises ``InvariantViolation`` (a ``RuntimeError``, which LangGraph neither retries nor applies).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.graph import StateGraph
from langgraph.types import interrupt

from stateguard.effects import recording
from stateguard.events import Event, emit
from stateguard.exceptions import ApprovalRejected, InvariantViolation
from stateguard.records import ApprovalRecord, ApprovalStatus, ErrorInfo, StepStatus
from stateguard.state import apply_update, as_dict, update_of
from stateguard.subgraphs import mark_subgraphs

if TYPE_CHECKING:
    from stateguard.core import GuardCore

# Marks a config whose graph was compiled by the guard, so the checkpointer's observation hooks
# (the drop-in path) stand aside and the wrappers alone journal the steps.
INSTRUMENTED_KEY = "__stateguard_instrumented"
# Marks a run driven by the guard's runner (guard.invoke & co.), which unwinds by itself.
RUNNER_KEY = "__stateguard_runner"
_TASK_ID_KEY = "__pregel_task_id"
_READ_STATE_KEY = "__pregel_read_state"
NODE_ATTR = "stateguard_node"  # set on exceptions raised by a node, naming it


def node_tags(metadata: Mapping[str, Any] | None) -> tuple[str, ...]:
    tags = (metadata or {}).get("tags", ())
    return (tags,) if isinstance(tags, str) else tuple(str(t) for t in tags)


Builder = StateGraph[Any, Any, Any, Any]


def instrument(builder: Builder, core: GuardCore) -> Builder:
    """A shallow copy of ``builder`` whose nodes are wrapped; the caller's builder is untouched."""
    from langgraph._internal._runnable import RunnableCallable

    from stateguard.tools import install, tool_nodes, tools_of

    runnables = {name: spec.runnable for name, spec in builder.nodes.items()}
    nodes = mark_subgraphs(core.spec, {name: node_tags(spec.metadata)
                                       for name, spec in builder.nodes.items()}, runnables)
    with_tools = tool_nodes(runnables)
    core.spec.validate_names(nodes, tools_of(with_tools))
    for tool_node in with_tools.values():
        install(tool_node, builder.channels)  # tool calls are steps (stateguard.tools)
    guarded = copy.copy(builder)
    guarded.nodes = {}
    for name, spec in builder.nodes.items():
        wrapper = _NodeWrapper(name, nodes[name], spec.runnable, core, builder.channels)
        runnable = RunnableCallable(wrapper.run, wrapper.arun, name=name, trace=False,
                                    recurse=False)
        guarded.nodes[name] = dataclasses.replace(spec, runnable=runnable)
    return guarded


class _NodeWrapper:
    def __init__(self, name: str, tags: tuple[str, ...], inner: Any, core: GuardCore,
                 channels: Mapping[str, Any]) -> None:
        self.name, self.tags, self.inner, self.core, self.channels = (
            name, tags, inner, core, channels)
        self.approval = core.spec.approvals.get(name, False)

    def run(self, state: Any, config: RunnableConfig) -> Any:
        run_id, step_id, values = self._before(state, config)
        try:
            with recording(self.core.journal, run_id, step_id, self.name):
                result = self.inner.invoke(state, config)
        except BaseException as exc:
            self._failed(run_id, step_id, exc)
            raise
        return self._after(run_id, step_id, values, result)

    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        run_id, step_id, values = self._before(state, config)
        try:
            with recording(self.core.journal, run_id, step_id, self.name):
                result = await self.inner.ainvoke(state, config)
        except BaseException as exc:
            self._failed(run_id, step_id, exc)
            raise
        return self._after(run_id, step_id, values, result)

    def _before(self, state: Any, config: RunnableConfig) -> tuple[str, str, dict[str, Any]]:
        conf = config.get("configurable", {})
        run_id, step_id = str(conf["thread_id"]), str(conf[_TASK_ID_KEY])
        values = _graph_state(state, conf)
        core = self.core
        if self.approval is not False:
            self._gate(run_id, step_id, values)
        found = core.spec.first_violation(values)
        if found is not None:
            exc = InvariantViolation(found[0].name, found[1], node=self.name, phase="before")
            emit(core.on_event, Event("invariant.violated", run_id, self.name, step_id,
                                      {"invariant": found[0].name, "message": found[1],
                                       "phase": "before"}))
            _tag(exc, self.name)
            raise exc
        core.check_lease(run_id)
        _, previous = core.journal.step_start(run_id, step_id, self.name, self.tags)
        if core.on_event is not None:  # the hot path: build events only for a listener
            emit(core.on_event, Event("step.started", run_id, self.name, step_id,
                                      {"in_doubt_rerun": previous == StepStatus.STARTED}))
        return run_id, step_id, values

    def _gate(self, run_id: str, step_id: str, values: dict[str, Any]) -> None:
        predicate = self.approval
        if callable(predicate) and not predicate(values):
            return
        approval_gate(self.core, run_id, step_id, self.name, {"node": self.name, "state": values})

    def _failed(self, run_id: str, step_id: str, exc: BaseException) -> None:
        bubbled = bubbled_up(exc)
        if bubbled is not None:
            self.core.journal.step_finish(run_id, step_id, bubbled[0], error=bubbled[1])
            return
        if not isinstance(exc, Exception):
            # Cancelled (a parallel sibling failed, under asyncio) or interrupted mid-body: the
            # effect may or may not have happened. The step stays "started", in doubt.
            return
        error = ErrorInfo.from_exception(exc)
        _tag(exc, self.name)
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
            core.journal.step_finish(run_id, step_id, StepStatus.VIOLATED, update=repr(result),
                                     state_after=values,
                                     error=ErrorInfo.from_exception(bad_result))
            raise _tag(bad_result, self.name) from None
        found = core.spec.first_violation(after)
        if found is None:
            core.journal.step_finish(run_id, step_id, StepStatus.SUCCEEDED, update=update,
                                     state_after=after)
            if core.on_event is not None:
                emit(core.on_event, Event("step.succeeded", run_id, self.name, step_id))
            return result
        invariant, message = found
        exc = InvariantViolation(invariant.name, message, node=self.name)
        # The body ran, so its effect happened: journal it as a step to compensate.
        core.journal.step_finish(run_id, step_id, StepStatus.VIOLATED, update=update,
                                 state_after=after, error=ErrorInfo.from_exception(exc))
        emit(core.on_event, Event("invariant.violated", run_id, self.name, step_id,
                                  {"invariant": invariant.name, "message": message}))
        raise _tag(exc, self.name)


def bubbled_up(exc: BaseException) -> tuple[StepStatus, ErrorInfo | None] | None:
    """How a body that LangGraph's own control flow left (``GraphBubbleUp``) ends its step, or
    ``None`` for anything else. ``interrupt()`` in the body pauses it: no effect happened, and
    it runs again from its start on resume. Any other bubble-up (a subgraph's ``Command`` to
    this graph, a drain) is no error of the body's either: LangGraph handles it, so no
    ``step.failed`` and no unwind; the step is journaled failed, without a traceback."""
    if isinstance(exc, GraphInterrupt):
        return StepStatus.PAUSED, None
    if isinstance(exc, GraphBubbleUp):
        return StepStatus.FAILED, ErrorInfo(type(exc).__name__, "bubbled up to LangGraph")
    return None


def approval_gate(core: GuardCore, run_id: str, step_id: str, name: str,
                  payload: dict[str, Any]) -> None:
    """Pause before the step ``step_id`` (a node, or one tool call) until its approval is
    decided; return if approved, raise ``ApprovalRejected`` if rejected. ``payload`` is what
    the operator sees."""
    journal = core.journal
    approval = journal.approval_request(ApprovalRecord(run_id, step_id, name, payload=payload))
    if approval.status == ApprovalStatus.APPROVED:
        return
    if approval.status == ApprovalStatus.REJECTED:
        raise _tag(ApprovalRejected(name, by=approval.decided_by, reason=approval.reason), name)
    emit(core.on_event, Event("approval.requested", run_id, name, step_id,
                              {"payload": approval.payload}))
    request = {"stateguard": "approval", "run_id": run_id, "node": name, "step_id": step_id}
    interrupt(request)
    # Reached only when someone resumed the graph with Command(resume=...) instead of
    # guard.approve(): the journal, not the resume value, decides.
    decided = next((a for a in journal.approvals(run_id) if a.step_id == step_id), approval)
    if decided.status == ApprovalStatus.APPROVED:
        return
    if decided.status == ApprovalStatus.REJECTED:
        raise _tag(ApprovalRejected(name, by=decided.decided_by, reason=decided.reason), name)
    interrupt({**request, "still_pending": True})  # pauses again: no second resume value


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


def _tag(exc: BaseException, node: str) -> BaseException:
    with contextlib.suppress(AttributeError):  # __slots__ exceptions; the journal names it
        setattr(exc, NODE_ATTR, node)
    return exc

