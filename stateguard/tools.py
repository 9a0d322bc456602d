"""Tool calls as steps: StateGuard inside LangGraph's ``ToolNode`` (and so inside
``create_react_agent``, v1 and v2).

An agent's effects happen in its tool calls, which LangGraph runs inside one node (``tools``):
all the calls of one model message in one task (``ToolNode``, ``create_react_agent(version=
"v1")``), or each call as a ``Send`` task of its own (v2, the default). So every ``ToolNode`` of
a guarded graph gets a tool-call wrapper (its public ``wrap_tool_call`` / ``awrap_tool_call``
hook, composed around any the user gave; a ``ToolNode`` inside a subgraph too) that, around
each call:

1. gates the call on an approval keyed by the tool's name (guarded form), its arguments as the
   payload, *before* it runs;
2. journals a step of its own, named by the tool and tagged with the tool's tags, whose id is
   ``<task id>:<call id>`` (so its compensation's idempotency key is per call), and records the
   call's effects (``record_effect``) under it;
3. runs the tool and journals the call's arguments and result (``ToolMessage`` content and
   artifact) as the step's update, and the graph's state with the answer appended as its state
   (a tool that pauses itself with ``interrupt()`` is journaled paused, and runs again on resume);
4. replays a call that already succeeded instead of running it again: LangGraph re-runs a whole
   task when it resumes it (after an approval, or a retry), and in v1 that task holds every
   call of the message. A tool that answered with a ``Command`` is replayed as that
   ``Command`` (its update, ``goto`` and ``graph``, journaled in plain form), so the state gets
   its update again.

A tool that raises fails its node as before (its siblings that succeeded are journaled, so they
are compensated). A tool error that ``ToolNode`` turned into a message (``handle_tool_errors``)
is decided by the guard's ``on_tool_error`` policy: ``"compensate"`` fails the node once its
calls are done (``ToolCallFailed``), which unwinds the run; ``"model"`` lets the model read the
error and go on; ``"auto"`` (the default) compensates when the tool has a compensation, recorded
an effect, or the run already has an effect to undo: never a silent success over a charge whose
booking failed. ``ToolNode`` turns any exception its wrapper raises into a message too, so the
node is failed by a wrapper around its body instead.

LangGraph internals relied on (docs/internals.md; tests/core/test_langgraph_internals.py checks
them against the pinned langgraph 1.2 / langgraph-prebuilt 1.1): the ``ToolNode`` attributes
holding the constructor's ``wrap_tool_call``/``awrap_tool_call`` (``_wrap_tool_call``/
``_awrap_tool_call``) and its body (``func``/``afunc``, as in every ``RunnableCallable``), set
on the graph's own ``ToolNode`` objects; and the config keys ``__pregel_checkpointer`` and
``__pregel_task_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import BaseMessage, ToolMessage, messages_from_dict, messages_to_dict
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.types import Command, Send

from stateguard.approvals import approval_gate
from stateguard.blame import NODE_ATTR, bubbled_up
from stateguard.core import GuardCore
from stateguard.effects import recording
from stateguard.events import Event, emit
from stateguard.exceptions import ToolCallFailed
from stateguard.faults import fault_point
from stateguard.history import answer_id
from stateguard.journal import find_step
from stateguard.kinds import kind_keywords, refusal_after_pivot, retry_delay
from stateguard.malformed_calls import tool_error_unwinds
from stateguard.records import ErrorInfo, StepStatus
from stateguard.state import apply_update, as_dict, update_of
from stateguard.tool_calls import TOOL_TAG, ToolCall

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest

_STEP_ID_MAX = 200  # what the journals store (the web app's step_id column)
_INSTALLED = "_stateguard_tool_guard"

# The handled tool errors that must fail the node running them: set around a ToolNode's body.
_failures: ContextVar[list[ToolCallFailed] | None] = ContextVar("stateguard_tool_failures",
                                                                default=None)


def tool_step_id(task_id: str, call_id: str) -> str:
    step_id = f"{task_id}:{call_id}"
    if len(step_id) <= _STEP_ID_MAX:
        return step_id
    return f"{task_id}:{hashlib.sha256(call_id.encode()).hexdigest()[:32]}"


def tool_nodes(runnables: Mapping[str, Any]) -> dict[str, ToolNode]:
    """The ``ToolNode``s among a graph's nodes (node name -> runnable)."""
    return {name: r for name, r in runnables.items() if isinstance(r, ToolNode)}


def subgraph_tool_nodes(runnables: Mapping[str, Any]
                        ) -> dict[str, tuple[ToolNode, Mapping[str, Any]]]:
    """The ``ToolNode``s inside the compiled subgraphs among a graph's nodes, at any depth:
    ``"<subgraph>/<node>"`` -> the node and its subgraph's channels (its calls see, and their
    compensations are given, the subgraph's state)."""
    found: dict[str, tuple[ToolNode, Mapping[str, Any]]] = {}
    for name, runnable in runnables.items():
        if not isinstance(runnable, Pregel):
            continue
        inner = {n: node.bound for n, node in runnable.nodes.items()}
        for inner_name, node in tool_nodes(inner).items():
            found[f"{name}/{inner_name}"] = (node, runnable.channels)
        found.update({f"{name}/{path}": v for path, v in subgraph_tool_nodes(inner).items()})
    return found


def tools_of(nodes: Mapping[str, ToolNode]) -> dict[str, tuple[str, ...]]:
    """Tool name -> its tags, for every tool the graph can call."""
    return {name: tuple(str(t) for t in (tool.tags or ()))
            for node in nodes.values() for name, tool in node.tools_by_name.items()}


def install(node: ToolNode, channels: Mapping[str, Any]) -> None:
    """Put StateGuard's tool-call wrapper on ``node`` (once). It stands aside in runs whose
    checkpointer is not a guard, so a ``ToolNode`` shared with an unguarded graph is safe."""
    if getattr(node, _INSTALLED, None) is not None:
        return
    guard = _ToolCallGuard(channels, getattr(node, "_messages_key", "messages"))
    user_sync, user_async = node._wrap_tool_call, node._awrap_tool_call
    node._wrap_tool_call = functools.partial(guard.wrap, user_sync)
    # A user's sync wrapper alone serves async runs too (ToolNode runs it with a sync execute):
    # keep that, so it is never called with a coroutine function.
    if user_async is not None or user_sync is None:
        node._awrap_tool_call = functools.partial(guard.awrap, user_async)
    if node.func is not None:
        node.func = _failing(node.func)
    if node.afunc is not None:
        node.afunc = _afailing(node.afunc)
    setattr(node, _INSTALLED, guard)


@contextlib.contextmanager
def _collecting_failures() -> Iterator[list[ToolCallFailed]]:
    failed: list[ToolCallFailed] = []
    token = _failures.set(failed)
    try:
        yield failed
    finally:
        _failures.reset(token)


def _failing(body: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _collecting_failures() as failed:
            out = body(*args, **kwargs)
        if failed:
            raise failed[0]
        return out
    return run


def _afailing(body: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(body)
    async def run(*args: Any, **kwargs: Any) -> Any:
        with _collecting_failures() as failed:
            out = await body(*args, **kwargs)
        if failed:
            raise failed[0]
        return out
    return run


Execute = Callable[["ToolCallRequest"], Any]


class _Call:
    """One tool call of a guarded run, from its start to its journaled end."""

    def __init__(self, core: GuardCore, request: ToolCallRequest, step_id: str,
                 run_id: str) -> None:
        self.core, self.request, self.step_id, self.run_id = core, request, step_id, run_id
        call = request.tool_call
        self.call_id, self.name = str(call.get("id") or ""), str(call["name"])
        self.args = dict(call.get("args") or {})
        tool = request.tool
        self.tags = (*(str(t) for t in (getattr(tool, "tags", None) or ())), TOOL_TAG)
        self.kind = core.spec.kind_for(self.name, self.tags)
        self.retry = core.spec.retry_for(self.name, self.tags)


class _ToolCallGuard:
    def __init__(self, channels: Mapping[str, Any], messages_key: str) -> None:
        self.channels, self.messages_key = channels, messages_key

    # -- the wrappers ToolNode calls --------------------------------------------------------
    def wrap(self, user: Callable[..., Any] | None, request: ToolCallRequest,
             execute: Execute) -> Any:
        call = self._begin(request)
        if call is None:
            return user(request, execute) if user else execute(request)
        replayed = self._replay(call)
        if replayed is not None:
            return replayed
        refused = self._refused(call)
        if refused is not None:
            return refused
        self._start(call)
        attempt = 1
        while True:  # more than once for a retriable tool only (stateguard.kinds)
            try:
                with recording(call.core.journal, call.run_id, call.step_id, call.name):
                    fault_point(call.core, "before", call.run_id, call.step_id, call.name,
                                "tool_call", attempt)
                    out = user(request, execute) if user else execute(request)
                    fault_point(call.core, "after", call.run_id, call.step_id, call.name,
                                "tool_call", attempt)
            except BaseException as exc:
                self._failed(call, exc)
                delay = retry_delay(call.retry, exc, attempt)
                if delay is None:
                    raise
            else:
                delay = self._again(call, out, attempt)
                if delay is None:
                    return self._finish(call, out)
            time.sleep(delay)
            attempt += 1
            self._start(call)

    async def awrap(self, user: Callable[..., Awaitable[Any]] | None, request: ToolCallRequest,
                    execute: Callable[[ToolCallRequest], Awaitable[Any]]) -> Any:
        call = self._begin(request)
        if call is None:
            return await (user(request, execute) if user else execute(request))
        replayed = self._replay(call)
        if replayed is not None:
            return replayed
        refused = self._refused(call)
        if refused is not None:
            return refused
        self._start(call)
        attempt = 1
        while True:
            try:
                with recording(call.core.journal, call.run_id, call.step_id, call.name):
                    fault_point(call.core, "before", call.run_id, call.step_id, call.name,
                                "tool_call", attempt)
                    out = await (user(request, execute) if user else execute(request))
                    fault_point(call.core, "after", call.run_id, call.step_id, call.name,
                                "tool_call", attempt)
            except BaseException as exc:
                self._failed(call, exc)
                delay = retry_delay(call.retry, exc, attempt)
                if delay is None:
                    raise
            else:
                delay = self._again(call, out, attempt)
                if delay is None:
                    return self._finish(call, out)
            await asyncio.sleep(delay)
            attempt += 1
            self._start(call)

    # -- the steps --------------------------------------------------------------------------
    @staticmethod
    def _begin(request: ToolCallRequest) -> _Call | None:
        """The call, if it runs in a guarded run (at the top level or in a subgraph), after its
        approval gate; ``None`` to stand aside."""
        runtime = getattr(request, "runtime", None)
        config = getattr(runtime, "config", None) or {}
        conf = config.get("configurable", {})
        core = getattr(conf.get("__pregel_checkpointer"), "core", None)
        task_id = conf.get("__pregel_task_id")
        # In a subgraph, the task id is the inner task's, as unique and as stable on a re-run.
        if not isinstance(core, GuardCore) or not task_id:
            return None
        call = _Call(core, request, tool_step_id(str(task_id), str(
            request.tool_call.get("id") or "")), str(conf["thread_id"]))
        approvals = core.spec.approvals
        gate = next((k for k in (call.name, *call.tags) if k in approvals), None)
        if gate is not None:
            predicate = approvals[gate]
            if predicate is None or predicate(call.args):
                approval_gate(core, call.run_id, call.step_id, call.name,
                              {"tool": call.name, "tool_call_id": call.call_id,
                               "args": call.args})
        return call

    def _replay(self, call: _Call) -> ToolMessage | Command[Any] | None:
        """The answer of a call this task already made, when LangGraph runs the task again:
        the ``Command`` it returned, or its ``ToolMessage``."""
        done = find_step(call.core.journal, call.run_id, call.step_id)
        journaled = (ToolCall.from_update(done.update)
                     if done is not None and done.status == StepStatus.SUCCEEDED else None)
        if journaled is None:
            return None
        if journaled.command is not None:
            return _command_from(journaled.command)
        return ToolMessage(content=journaled.content, artifact=journaled.artifact,
                           tool_call_id=call.call_id, name=call.name, status="success",
                           id=answer_id(call.step_id))

    def _refused(self, call: _Call) -> ToolMessage | None:
        """A compensatable call the model makes after the turn's pivot never runs: it fails
        its node (which holds the run for a person; nothing is undone past a pivot)."""
        refused = refusal_after_pivot(call.core, call.run_id, call.name, call.tags, call.kind)
        if refused is None:
            return None
        self._fail_node(call, str(refused))
        return ToolMessage(content=f"Not run: {refused}", tool_call_id=call.call_id,
                           name=call.name, status="error")

    def _again(self, call: _Call, out: Any, attempt: int) -> float | None:
        """For a retriable tool whose error ``ToolNode`` turned into a message: journal the
        attempt failed and return the wait before the next one (``None``: keep the answer)."""
        message = _tool_message(out, call.call_id)
        if call.retry is None or message is None or message.status != "error":
            return None
        delay = retry_delay(call.retry, ToolCallFailed(call.name, call.call_id,
                                                       str(message.content)), attempt)
        if delay is not None:
            call.core.journal.step_finish(
                call.run_id, call.step_id, StepStatus.FAILED,
                update=self._record(call, "error", message.content, None).as_update(),
                error=ErrorInfo("ToolError", str(message.content)))
        return delay

    def _start(self, call: _Call) -> None:
        core = call.core
        core.check_lease(call.run_id)
        core.histories.restart(call.run_id, call.step_id)
        _, previous = core.journal.step_start(call.run_id, call.step_id, call.name, call.tags,
                                              **kind_keywords(call.kind))
        emit(core.on_event, Event("step.started", call.run_id, call.name, call.step_id,
                                  {"tool_call_id": call.call_id, "args": call.args,
                                   "in_doubt_rerun": previous == StepStatus.STARTED}))

    def _failed(self, call: _Call, exc: BaseException) -> None:
        journal = call.core.journal
        bubbled = bubbled_up(exc)  # interrupt() inside the tool: paused, it runs again
        if bubbled is not None:
            journal.step_finish(call.run_id, call.step_id, bubbled[0], error=bubbled[1])
            return
        if not isinstance(exc, Exception):
            return  # cancelled mid-call: the step stays started, in doubt
        if not getattr(exc, NODE_ATTR, None):
            with contextlib.suppress(AttributeError):  # __slots__: the journal names the tool
                setattr(exc, NODE_ATTR, call.name)
        error = ErrorInfo.from_exception(exc)
        journal.step_finish(call.run_id, call.step_id, StepStatus.FAILED,
                            update=self._record(call, "error", str(exc), None).as_update(),
                            error=error)
        emit(call.core.on_event, Event("step.failed", call.run_id, call.name, call.step_id,
                                       {"error": str(error)}))

    def _finish(self, call: _Call, out: Any) -> Any:
        message = _tool_message(out, call.call_id)
        if isinstance(out, ToolMessage) and out.id is None:
            # Named now, not by add_messages later, so that the journal holds the message the
            # graph does, and can rebuild it from the call's record (stateguard.history).
            out.id = answer_id(call.step_id)
        status: Literal["success", "error"] = (
            "error" if message is not None and message.status == "error" else "success")
        content = message.content if message is not None else None
        artifact = message.artifact if message is not None else None
        record = self._record(call, status, content, artifact)
        if isinstance(out, Command):
            record = ToolCall(record.id, record.name, record.args, record.status,
                              record.content, record.artifact, _command_record(out))
        core = call.core
        if status == "error":
            error = ErrorInfo("ToolError", str(content))
            core.journal.step_finish(call.run_id, call.step_id, StepStatus.FAILED,
                                     update=record.as_update(), error=error)
            emit(core.on_event, Event("step.failed", call.run_id, call.name, call.step_id,
                                      {"error": str(error), "handled": True}))
            if self._unwinds(call):
                self._fail_node(call, str(content))
            return out
        before, after = self._state_after(call, out)
        state = core.histories.encode(call.run_id, call.step_id, before, after, answer=(
            (out, record) if isinstance(out, ToolMessage) else None))
        core.journal.step_finish(call.run_id, call.step_id, StepStatus.SUCCEEDED,
                                 update=record.as_update(), state_after=state.state)
        core.histories.keep(call.run_id, call.step_id, state)
        emit(core.on_event, Event("step.succeeded", call.run_id, call.name, call.step_id,
                                  {"tool_call_id": call.call_id}))
        return out

    def _state_after(self, call: _Call, out: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The graph's state the call ran on, and with the call's answer: what its compensation
        is given."""
        values = as_dict(call.request.state)
        messages = values.get(self.messages_key)
        if isinstance(out, ToolMessage) and isinstance(messages, list):
            # Appended as add_messages would (the answer has its id), without its reducer: it
            # copies and converts the whole history, at every call.
            return values, {**values, self.messages_key: [*messages, out]}
        try:
            return values, apply_update(self.channels, values, update_of(out) if isinstance(
                out, Command) else {self.messages_key: [out]})
        except Exception:  # a state the reducers cannot take: keep the state the call saw
            return values, values

    @staticmethod
    def _record(call: _Call, status: Literal["success", "error"], content: Any,
                artifact: Any) -> ToolCall:
        return ToolCall(call.call_id, call.name, call.args, status, content, artifact)

    @staticmethod
    def _unwinds(call: _Call) -> bool:
        """Whether a tool error the model was told about unwinds the run (``on_tool_error``)."""
        return tool_error_unwinds(call.core, call.run_id, call.name, call.tags, call.step_id)

    @staticmethod
    def _fail_node(call: _Call, message: str) -> None:
        exc = ToolCallFailed(call.name, call.call_id, message)
        setattr(exc, NODE_ATTR, call.name)
        failed = _failures.get()
        if failed is None:  # no body wrapper around us (a ToolNode called by hand): raise
            raise exc
        failed.append(exc)


def _tool_message(out: Any, call_id: str) -> ToolMessage | None:
    """The ``ToolMessage`` answering ``call_id`` in what a tool call returned (a message, a
    ``Command`` carrying it, or a list of them)."""
    if isinstance(out, ToolMessage):
        return out
    items = out if isinstance(out, list) else [out]
    for item in items:
        if isinstance(item, ToolMessage) and item.tool_call_id == call_id:
            return item
        if isinstance(item, Command) and item.update is not None:
            messages = update_of(item).get("messages") or []
            for message in messages if isinstance(messages, list) else [messages]:
                if isinstance(message, ToolMessage) and message.tool_call_id == call_id:
                    return message
    return None


# -- a Command in plain form, for the journal (which may store JSON) --------------------------
def _command_record(command: Command[Any]) -> dict[str, Any]:
    """``command``'s update (messages as LangChain's message dicts), goto and graph."""
    update = {key: _plain_messages(value) for key, value in update_of(command).items()}
    gotos = command.goto if isinstance(command.goto, (list, tuple)) else [command.goto]
    goto = [{"send": g.node, "arg": g.arg} if isinstance(g, Send) else g for g in gotos]
    return {"update": update, "goto": goto, "graph": command.graph}


def _command_from(record: Mapping[str, Any]) -> Command[Any]:
    update = {key: _messages_again(value) for key, value in (record.get("update") or {}).items()}
    goto = [Send(g["send"], g.get("arg")) if isinstance(g, Mapping) and "send" in g else g
            for g in record.get("goto") or ()]
    return Command(graph=record.get("graph"), update=update,
                   goto=goto[0] if len(goto) == 1 else goto)


def _plain_messages(value: Any) -> Any:
    if isinstance(value, BaseMessage):
        return {"stateguard:messages": messages_to_dict([value])}
    if isinstance(value, list) and value and all(isinstance(v, BaseMessage) for v in value):
        return {"stateguard:messages": messages_to_dict(value), "list": True}
    return value


def _messages_again(value: Any) -> Any:
    if isinstance(value, Mapping) and "stateguard:messages" in value:
        messages = messages_from_dict(value["stateguard:messages"])
        return messages if value.get("list") else messages[0]
    return value
