"""LangGraph's Functional API: every ``@task`` call a saga step, in an ``@entrypoint`` and in a
graph's node alike.

A task is LangGraph's durable unit: its result is saved with the run's checkpoint, and a
re-run of the code that called it (a resume after ``interrupt()``, a retry, a recovery) gets
that result instead of running it again. StateGuard journals each call as a step of its own:

- named by the task (``task(name=...)`` or its function's name) and tagged ``stateguard:task``,
  so compensations, approvals and kinds are keyed by the task's name;
- whose id is ``<id of the calling node's task>:task:<name>:<n>`` (the n-th call of that task
  in one run of the caller's body): the same on every re-run of the caller, so the step's
  ``ctx.idempotency_key`` (its compensation's) and ``effect_key()`` (its effect's, inside the
  body) are stable across resumes, retries and recoveries;
- journaled started before the body runs (a crash leaves it in doubt), succeeded with the
  task's return value as its update (``ctx.step_result``) and its arguments, by name, as its
  state (a compensation's ``state``), or failed with its error; parallel futures each finish
  on their own, so they are undone newest first like any steps;
- replayed from the journal when it succeeded in this turn and the caller runs it again
  (LangGraph replays it too, from its saved writes; the journal also covers writes a crash or
  a durability mode lost, and a body retried by the guard or by a ``retry_policy``).

How it hooks in: the guard's wrapper around each node (``stateguard.instrument``) runs the
body with a ``config`` whose ``__pregel_call`` (the function LangGraph's ``task.__call__``
hands each call to) wraps the task's function first, then hands it on: the task keeps its
name (hence its LangGraph task id), its retry, cache and timeout policies. The names a guard
accepts are those of the tasks the graph's code refers to (a node's function, and the
functions of its module it calls, a few levels deep). LangGraph internals relied on
(docs/internals.md, tests/core/test_langgraph_internals.py): the config key
``__pregel_call``, and ``get_config()`` reading langchain-core's ``var_child_runnable_config``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.func import task as _langgraph_task

from stateguard.approvals import approval_gate
from stateguard.blame import bubbled_up, from_the_store, tag_node
from stateguard.effects import recording
from stateguard.events import Event, emit
from stateguard.faults import fault_point
from stateguard.journal import find_step
from stateguard.kinds import kind_keywords, refusal_after_pivot, retry_delay
from stateguard.records import ErrorInfo, StepStatus

if TYPE_CHECKING:
    from stateguard.core import GuardCore

__all__ = ["TASK_TAG", "guarding_calls", "task_step_id", "tasks_of"]

TASK_TAG = "stateguard:task"
CALL_KEY = "__pregel_call"  # LangGraph's CONFIG_KEY_CALL: where a task call is handed
_STEP_ID_MAX = 200  # what the journals store (the web app's step_id column)
_SCAN_DEPTH = 4
# Arguments LangGraph injects by name: not the task's own.
_INJECTED = frozenset({"config", "runtime", "store", "writer", "previous"})


def _probe() -> None:  # pragma: no cover - never called
    return None


# The type of what ``@task`` returns, found through the public decorator.
_TASK_TYPE: type = type(_langgraph_task(_probe))


def task_step_id(parent_step_id: str, name: str, n: int) -> str:
    step_id = f"{parent_step_id}:task:{name}:{n}"
    if len(step_id) <= _STEP_ID_MAX:
        return step_id
    digest = hashlib.sha256(f"{name}:{n}".encode()).hexdigest()[:32]
    return f"{parent_step_id[:_STEP_ID_MAX - 38]}:task:{digest}"


# -- the names a guard accepts ------------------------------------------------------------------
def tasks_of(runnables: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Task name -> its tags, for the ``@task``s the graph's node functions refer to (directly,
    or through the functions of their module they call, a few levels deep)."""
    found: dict[str, tuple[str, ...]] = {}
    seen: set[int] = set()

    def visit(fn: Any, depth: int) -> None:
        fn = inspect.unwrap(fn) if callable(fn) else fn
        if not inspect.isfunction(fn) or id(fn) in seen or depth > _SCAN_DEPTH:
            return
        seen.add(id(fn))
        try:
            refs = inspect.getclosurevars(fn)
        except (TypeError, ValueError):
            return
        for value in (*refs.nonlocals.values(), *refs.globals.values()):
            if isinstance(value, _TASK_TYPE):
                found[str(getattr(value, "__name__", ""))] = (TASK_TAG,)
                visit(getattr(value, "func", None), depth + 1)  # tasks that call tasks
            elif inspect.isfunction(value) and value.__module__ == fn.__module__:
                visit(value, depth + 1)

    for runnable in runnables.values():
        for body in (getattr(runnable, "func", None), getattr(runnable, "afunc", None)):
            visit(body, 0)
    found.pop("", None)
    return found


# -- while a body runs --------------------------------------------------------------------------
class _Caller:
    """The step whose body is running (a node's, or a task's): where its task calls go."""

    def __init__(self, core: GuardCore, run_id: str, step_id: str) -> None:
        self.core, self.run_id, self.step_id = core, run_id, step_id
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()  # a body may call tasks from threads of its own

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """``func`` as a step of this run; keeps its name, so LangGraph's task id is kept."""
        name = str(getattr(func, "__name__", None) or type(func).__name__)
        with self._lock:
            n = self._counts[name] = self._counts.get(name, 0) + 1
        step = _TaskStep(self.core, self.run_id, task_step_id(self.step_id, name, n), name)
        guarded: Callable[..., Any]
        if _is_async(func):
            async def guarded(*args: Any, **kwargs: Any) -> Any:
                return await step.arun(func, args, kwargs)
        else:
            def guarded(*args: Any, **kwargs: Any) -> Any:
                return step.run(func, args, kwargs)
        return functools.update_wrapper(guarded, func)


def _is_async(func: Any) -> bool:
    call = type(func).__call__ if not inspect.isroutine(func) else None
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call)


@contextlib.contextmanager
def guarding_calls(core: GuardCore, run_id: str, step_id: str, config: RunnableConfig | None
                   ) -> Iterator[RunnableConfig | None]:
    """Around a body: the config to run it with, whose task calls are steps of ``step_id``'s
    run (the config as it is when LangGraph gave no way to call tasks)."""
    conf = (config or {}).get("configurable") or {}
    hand_on = conf.get(CALL_KEY)
    if config is None or hand_on is None:
        yield config
        return
    caller = _Caller(core, run_id, step_id)

    def call(func: Callable[..., Any], input: Any, *args: Any, **kwargs: Any) -> Any:
        return hand_on(caller.wrap(func), input, *args, **kwargs)

    patched: RunnableConfig = {**config, "configurable": {**conf, CALL_KEY: call}}
    # LangGraph's task() reads the config of the runnable context (get_config()), not the
    # one a body is given: set both.
    token = var_child_runnable_config.set(patched)
    try:
        yield patched
    finally:
        var_child_runnable_config.reset(token)


class _TaskStep:
    """One task call of a guarded run, from its start to its journaled end."""

    def __init__(self, core: GuardCore, run_id: str, step_id: str, name: str) -> None:
        self.core, self.run_id, self.step_id, self.name = core, run_id, step_id, name
        self.tags = (TASK_TAG,)
        self.kind = core.spec.kind_for(name, self.tags)
        self.retry = core.spec.retry_for(name, self.tags)
        self.values: dict[str, Any] = {}  # its arguments, by name

    def run(self, func: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        done, result = self._replayed()
        if done:
            return result
        values = self._before(func, args, kwargs)
        attempt = 1
        while True:  # more than once for a retriable task only (stateguard.kinds)
            try:
                with recording(self.core.journal, self.run_id, self.step_id, self.name), \
                        guarding_calls(self.core, self.run_id, self.step_id,
                                       var_child_runnable_config.get()):
                    fault_point(self.core, "before", self.run_id, self.step_id, self.name,
                                "task", attempt)
                    result = func(*args, **kwargs)
                    fault_point(self.core, "after", self.run_id, self.step_id, self.name,
                                "task", attempt)
            except BaseException as exc:
                self._failed(exc)
                delay = retry_delay(self.retry, exc, attempt)
                if delay is None:
                    raise
                time.sleep(delay)
                attempt += 1
                self._start()
                continue
            return self._finish(result, values)

    async def arun(self, func: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        done, result = self._replayed()
        if done:
            return result
        values = self._before(func, args, kwargs)
        attempt = 1
        while True:
            try:
                with recording(self.core.journal, self.run_id, self.step_id, self.name), \
                        guarding_calls(self.core, self.run_id, self.step_id,
                                       var_child_runnable_config.get()):
                    fault_point(self.core, "before", self.run_id, self.step_id, self.name,
                                "task", attempt)
                    result = await func(*args, **kwargs)
                    fault_point(self.core, "after", self.run_id, self.step_id, self.name,
                                "task", attempt)
            except BaseException as exc:
                self._failed(exc)
                delay = retry_delay(self.retry, exc, attempt)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                attempt += 1
                self._start()
                continue
            return self._finish(result, values)

    def _replayed(self) -> tuple[bool, Any]:
        """``(True, result)`` when this call succeeded in this turn already: the caller runs
        again (a resume, a retry, a recovery) and gets what the task returned then."""
        journal = self.core.journal
        with from_the_store():
            done = find_step(journal, self.run_id, self.step_id)
            if done is None or done.status != StepStatus.SUCCEEDED:
                return False, None
            run = journal.run_get(self.run_id)
        if run is not None and done.turn != run.turn:
            return False, None  # an earlier turn's (time travel runs the same task ids)
        return True, done.update

    def _before(self, func: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> dict[str, Any]:
        values = self.values = _arguments(func, args, kwargs)
        approvals = self.core.spec.approvals
        if self.name in approvals:
            predicate = approvals[self.name]
            if predicate is None or predicate(values):
                approval_gate(self.core, self.run_id, self.step_id, self.name,
                              {"task": self.name, "args": values})
        refused = refusal_after_pivot(self.core, self.run_id, self.name, self.tags, self.kind)
        if refused is not None:
            raise tag_node(refused, self.name)
        self._start()
        return values

    def _start(self) -> None:
        core = self.core
        core.check_lease(self.run_id)
        core.check_stop(self.run_id, self.name)
        with from_the_store():
            _, previous = core.journal.step_start(self.run_id, self.step_id, self.name,
                                                  self.tags, **kind_keywords(self.kind))
        emit(core.on_event, Event("step.started", self.run_id, self.name, self.step_id,
                                  {"task": True,
                                   "in_doubt_rerun": previous == StepStatus.STARTED}))

    def _failed(self, exc: BaseException) -> None:
        journal = self.core.journal
        bubbled = bubbled_up(exc)  # interrupt() inside the task: paused, it runs again
        if bubbled is not None:
            with from_the_store():
                journal.step_finish(self.run_id, self.step_id, bubbled[0], error=bubbled[1])
            return
        if not isinstance(exc, Exception):
            return  # cancelled mid-body: the step stays started, in doubt
        error = ErrorInfo.from_exception(exc)
        with from_the_store():
            # With its arguments: an in_doubt_safe compensation looks for its effect by them.
            journal.step_finish(self.run_id, self.step_id, StepStatus.FAILED,
                                state_after=self.values, error=error)
        emit(self.core.on_event, Event("step.failed", self.run_id, self.name, self.step_id,
                                       {"error": str(error)}))

    def _finish(self, result: Any, values: dict[str, Any]) -> Any:
        with from_the_store():
            self.core.journal.step_finish(self.run_id, self.step_id, StepStatus.SUCCEEDED,
                                          update=result, state_after=values)
        if self.core.on_event is not None:
            emit(self.core.on_event, Event("step.succeeded", self.run_id, self.name,
                                           self.step_id))
        return result


def _arguments(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> dict[str, Any]:
    """A task's arguments by parameter name (what its compensation gets as ``state``)."""
    try:
        bound = inspect.signature(func).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return {"args": list(args), **{k: v for k, v in kwargs.items() if k not in _INJECTED}}
    return {k: v for k, v in bound.arguments.items() if k not in _INJECTED}
