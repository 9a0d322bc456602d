"""``StateGuardCheckpointer``: a LangGraph checkpoint saver that turns a graph into a saga."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Self, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.memory import InMemorySaver

from stateguard.blame import from_the_store
from stateguard.core import GuardCore
from stateguard.events import EventCallback
from stateguard.exceptions import ConfigurationError
from stateguard.faults import FaultHook
from stateguard.journal import Journal, PurgingJournal
from stateguard.operator_actions import GuardOperations
from stateguard.plain_runs import PlainRuns
from stateguard.retry import CompensationRetry
from stateguard.runner import OnError
from stateguard.tool_policy import OnToolError

# What the guard forwards to its saver. Each is a capability LangGraph reads off the class (its
# conformance suite, for one: a method overridden from BaseCheckpointSaver is one the saver
# has), so a guard's class has exactly the ones its saver's class has (``__new__``, below).
FORWARDED = tuple(name for method in ("get_tuple", "list", "put", "put_writes", "delete_thread",
                                      "delete_for_runs", "copy_thread", "prune")
                  for name in (method, "a" + method))


def has_capability(saver_type: type, name: str) -> bool:
    """Whether ``saver_type`` overrides ``BaseCheckpointSaver.<name>`` (has that capability)."""
    return getattr(saver_type, name, None) is not getattr(BaseCheckpointSaver, name)


class StateGuardCheckpointer(GuardOperations, BaseCheckpointSaver[Any]):
    """Wraps any LangGraph checkpoint saver and adds invariants, compensations and approvals.

    Drop-in: compile with it and invoke the graph as usual (``stateguard.plain_runs``)::

        checkpointer = StateGuardCheckpointer(
            invariants=[no_negative_balance],
            compensations={"charge_user": refund_stripe_charge},
        )
        graph = builder.compile(checkpointer=checkpointer)
        graph.invoke({...}, {"configurable": {"thread_id": "t1"}})

    Both forms wrap every node of the graph in the same way (``stateguard.instrument``); the
    guard's runner adds what a plain invoke cannot return (``SagaAborted`` with the report, a
    refusal instead of an output)::

        graph = checkpointer.compile(builder)      # the same as builder.compile(...), wrapped now
        checkpointer.invoke(graph, {...}, {"configurable": {"thread_id": "t1"}})
        checkpointer.approve(graph, config, by="alice")   # operator actions work on either

    ``on_error`` says what a node's exception does to a guarded run: ``"compensate"`` unwinds
    it, ``"hold"`` keeps it ``failed`` for an operator to retry or compensate, and a function
    ``policy(exc) -> "compensate" | "hold"`` decides per error (hold a provider's timeout, which a
    retry may fix; unwind a business error, which it will not).

    ``compensations`` keys are node names or tags declared on nodes with
    ``builder.add_node(name, fn, metadata={"tags": ["payment"]})``. A node without a compensation
    is treated as having no external effect: nothing is undone for it.

    ``kinds`` marks the saga's point of no return (``stateguard.kinds``): ``{"ship": "pivot",
    "send_receipt": "retriable"}``, keyed like compensations. Once a pivot had its effect the
    run only goes forward: a retriable step is retried (``step_retry``, or ``Retriable(retry)``
    per key), and a failure past that holds the run ``needs_attention``, nothing undone.

    The guard has the capabilities of its saver, no more and no fewer: around a saver without
    ``prune`` (``aprune``, ``copy_thread``, an async API...) the guard's class has the base
    class's method too (``NotImplementedError``), so whoever asks the class what it can do (as
    LangGraph's conformance suite does) gets the saver's answer. Such a guard is an instance of a
    subclass that differs in that alone.
    """

    def __new__(cls, saver: BaseCheckpointSaver[Any] | None = None, *args: Any,
                **kwargs: Any) -> Self:
        if cls.__dict__.get("_narrowed"):  # made by _without: a copy of a guard, say
            return object.__new__(cls)
        saver_type = InMemorySaver if saver is None else type(saver)
        missing = frozenset(
            name for name in FORWARDED
            if issubclass(saver_type, BaseCheckpointSaver)
            and not has_capability(saver_type, name)
            and getattr(cls, name) is getattr(StateGuardCheckpointer, name))  # a subclass's own
        narrowed = _without(cast(type[StateGuardCheckpointer], cls), missing) if missing else cls
        return cast(Self, object.__new__(narrowed))

    def __init__(self, saver: BaseCheckpointSaver[Any] | None = None, *,
                 invariants: Iterable[Any] = (),
                 compensations: Mapping[str, Any] | None = None,
                 approvals: Iterable[str] | Mapping[str, Any] | None = None,
                 compensation_retry: CompensationRetry | None = None,
                 journal: Journal | None = None, on_event: EventCallback | None = None,
                 on_error: OnError = "compensate", on_tool_error: OnToolError = "auto",
                 lease_ttl: float = 60.0, lease_heartbeat: float | None = None,
                 kinds: Mapping[str, Any] | None = None,
                 step_retry: CompensationRetry | None = None,
                 fault_hook: FaultHook | None = None) -> None:
        if saver is None:
            saver = InMemorySaver()
        if not isinstance(saver, BaseCheckpointSaver):
            raise ConfigurationError(
                f"saver must be a LangGraph BaseCheckpointSaver, not {saver!r}")
        if isinstance(saver, StateGuardCheckpointer):
            raise ConfigurationError("a StateGuardCheckpointer cannot wrap another one")
        if not callable(on_error) and on_error not in ("compensate", "hold"):
            raise ConfigurationError("on_error must be 'compensate', 'hold', or a function of "
                                     "the node's exception returning one of them")
        defers = getattr(journal, "defers_steps", False)
        if defers and getattr(saver, "journal", None) is not journal:
            raise ConfigurationError("a journal that defers step rows (defers_steps) needs the "
                                     "saver that writes them: saver.journal must be the journal")
        super().__init__(serde=saver.serde)
        self.saver = saver
        self.core = GuardCore(invariants=invariants, compensations=compensations,
                              approvals=approvals, compensation_retry=compensation_retry,
                              journal=journal, on_event=on_event, lease_ttl=lease_ttl,
                              lease_heartbeat=lease_heartbeat, on_tool_error=on_tool_error,
                              kinds=kinds, step_retry=step_retry, fault_hook=fault_hook)
        self.on_error = on_error
        self._plain_runs = PlainRuns(self)

    @property
    def journal(self) -> Journal:
        return self.core.journal

    # -- delegation, sync -------------------------------------------------------------------
    @property
    def config_specs(self) -> list[Any]:
        return list(self.saver.config_specs)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        with from_the_store():
            saved = self.saver.get_tuple(config)
        self._plain_runs.on_get_tuple(config, saved)
        return saved

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        return self.saver.list(config, filter=filter, before=before, limit=limit)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        with from_the_store():
            return self.saver.put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        with from_the_store():
            self.saver.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints and forget its run in the journal (when the journal
        can forget one: ``PurgingJournal``)."""
        self.saver.delete_thread(thread_id)
        self._forget(str(thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """The saver's ``prune`` (``NotImplementedError`` from a saver without one).

        ``"keep_latest"`` drops a thread's older checkpoints and keeps its saga records: they
        are the audit of what its run did to the world, and what its compensations read (a
        retry from an earlier step needs the history pruned away, and is refused without it).
        ``"delete"`` deletes the threads, and forgets their runs as ``delete_thread`` does."""
        self.saver.prune(thread_ids, strategy=strategy)
        if strategy == "delete":
            for thread_id in thread_ids:
                self._forget(str(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """The saver's ``copy_thread``. The copy starts with no saga record: the effects of
        the source's steps are the source run's to undo, never undone twice through a copy."""
        self.saver.copy_thread(source_thread_id, target_thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """The saver's ``delete_for_runs``: the checkpoints LangGraph's runs (``run_id`` in a
        checkpoint's metadata, not a saga's thread) wrote. Saga records are kept."""
        self.saver.delete_for_runs(run_ids)

    def _forget(self, run_id: str) -> None:
        if isinstance(self.core.journal, PurgingJournal):
            self.core.journal.run_purge(run_id)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)

    def with_allowlist(self, extra_allowlist: Any) -> StateGuardCheckpointer:
        # Strict msgpack mode calls this at compile(); keep the guard, swap in the new saver.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.saver = self.saver.with_allowlist(extra_allowlist)
        clone.serde = clone.saver.serde
        return clone

    # -- delegation, async ------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        with from_the_store():
            saved = await self.saver.aget_tuple(config)
        self._plain_runs.on_get_tuple(config, saved)
        return saved

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        async for item in self.saver.alist(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        with from_the_store():
            return await self.saver.aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        with from_the_store():
            await self.saver.aput_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)
        await asyncio.to_thread(self._forget, str(thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest"
                     ) -> None:
        await self.saver.aprune(thread_ids, strategy=strategy)
        if strategy == "delete":
            for thread_id in thread_ids:
                await asyncio.to_thread(self._forget, str(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.saver.acopy_thread(source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.saver.adelete_for_runs(run_ids)


_NARROWED: dict[tuple[type[StateGuardCheckpointer], frozenset[str]],
                type[StateGuardCheckpointer]] = {}


def _without(cls: type[StateGuardCheckpointer], missing: frozenset[str]
             ) -> type[StateGuardCheckpointer]:
    """``cls`` with BaseCheckpointSaver's own ``missing`` methods: what its saver lacks (one
    class per saver's set of capabilities)."""
    if (narrowed := _NARROWED.get((cls, missing))) is None:
        namespace: dict[str, Any] = {name: getattr(BaseCheckpointSaver, name)
                                     for name in missing}
        namespace.update(__module__=cls.__module__, __qualname__=cls.__qualname__,
                         __doc__=cls.__doc__, _narrowed=True)
        narrowed = _NARROWED.setdefault((cls, missing), type(cls.__name__, (cls,), namespace))
    return narrowed
