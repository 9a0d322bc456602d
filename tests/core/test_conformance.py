"""LangGraph's checkpointer conformance suite (langgraph-checkpoint-conformance) on the guard.

Differential: each official saver alone is the reference. ``StateGuardCheckpointer`` around it
must be detected with the same capabilities (it hides none of the saver's, claims none the saver
lacks) and pass and fail exactly the same checks. The suite speaks LangGraph's async API only; a
sync saver (``SqliteSaver``, ``PostgresSaver``) is run behind ``async_face``, which makes each
async call the sync one in a worker thread, as a sync graph calls it: so the guard's sync
forwarding is what is checked there.
"""

from __future__ import annotations

import asyncio
import copy
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from stateguard import StateGuardCheckpointer

BASE = {c.value for c in BASE_CAPABILITIES}
# What each saver alone is detected with at the pinned versions (the reference's own check: a
# LangGraph upgrade that adds a capability shows here first, and the guard must then forward it).
EXPECTED = {
    "InMemorySaver": BASE,
    "SqliteSaver": BASE,
    "AsyncSqliteSaver": BASE,
    "PostgresSaver": BASE | {"prune"},
    "AsyncPostgresSaver": BASE | {"prune"},
    # No official saver has copy_thread or delete_for_runs at the pinned versions: this one
    # (below) has every capability, so that the guard's forwarding of each is checked too.
    "ExtendedMemorySaver": BASE | {"prune", "copy_thread", "delete_for_runs"},
}
POSTGRES = {"PostgresSaver", "AsyncPostgresSaver"}
SYNC_METHODS = ("get_tuple", "list", "put", "put_writes", "delete_thread", "delete_for_runs",
                "copy_thread", "prune")


def has(saver_type: type, method: str) -> bool:
    """The suite's test of a capability: the method is overridden from BaseCheckpointSaver."""
    return getattr(saver_type, method, None) is not getattr(BaseCheckpointSaver, method)


class ExtendedMemorySaver(InMemorySaver):
    """InMemorySaver with the extended capabilities, sync and async (a reference for the test)."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        for ns, saved in list(self.storage[source_thread_id].items()):
            self.storage[target_thread_id][ns] = dict(saved)
        for key, writes in list(self.writes.items()):
            if key[0] == source_thread_id:
                self.writes[(target_thread_id, *key[1:])] = dict(writes)
        for blob_key, blob in list(self.blobs.items()):
            if blob_key[0] == source_thread_id:
                self.blobs[(target_thread_id, *blob_key[1:])] = blob

    def delete_for_runs(self, run_ids: Any) -> None:
        runs = set(run_ids)
        for thread_id, namespaces in self.storage.items():
            for ns, saved in namespaces.items():
                for checkpoint_id, (_, metadata, _) in list(saved.items()):
                    if self.serde.loads_typed(metadata).get("run_id") in runs:
                        del saved[checkpoint_id]
                        self.writes.pop((thread_id, ns, checkpoint_id), None)

    def prune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            for ns, saved in self.storage.get(thread_id, {}).items():
                for checkpoint_id in sorted(saved)[:-1]:
                    del saved[checkpoint_id]
                    self.writes.pop((thread_id, ns, checkpoint_id), None)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Any) -> None:
        self.delete_for_runs(run_ids)

    async def aprune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)


# -- a sync saver behind the async API ---------------------------------------------------------

class AsyncFace(BaseCheckpointSaver[Any]):
    """A sync saver's methods as LangGraph's async ones, each call in a worker thread."""

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)


def _threaded(method: str) -> Callable[..., Any]:
    async def call(self: AsyncFace, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.saver, method), *args, **kwargs)
    return call


async def _alist(self: AsyncFace, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
    for item in await asyncio.to_thread(lambda: list(self.saver.list(config, **kwargs))):
        yield item


def async_face(saver: BaseCheckpointSaver[Any]) -> BaseCheckpointSaver[Any]:
    """``saver`` with the async capability ``aX`` exactly where its class has the sync ``X``."""
    methods = {f"a{m}": _alist if m == "list" else _threaded(m)
               for m in SYNC_METHODS if has(type(saver), m)}
    face: type[AsyncFace] = type(f"AsyncFace_{type(saver).__name__}", (AsyncFace,), methods)
    return face(saver)


# -- the savers --------------------------------------------------------------------------------

@asynccontextmanager
async def official(name: str, dsn: str | None) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """A fresh saver of that name (the suite asks for one per capability)."""
    if name == "InMemorySaver":
        yield InMemorySaver()
    elif name == "ExtendedMemorySaver":
        yield ExtendedMemorySaver()
    elif name == "SqliteSaver":
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
    elif name == "AsyncSqliteSaver":
        async with AsyncSqliteSaver.from_conn_string(":memory:") as asaver:
            yield asaver
    elif name == "PostgresSaver":
        assert dsn is not None
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
            yield saver
    else:
        assert name == "AsyncPostgresSaver" and dsn is not None
        async with AsyncPostgresSaver.from_conn_string(dsn) as apsaver:
            await apsaver.setup()
            yield apsaver


@dataclass
class Outcome:
    """What the suite found: the capabilities detected, and each check's result by capability."""

    name: str
    detected: set[str] = field(default_factory=set)
    checks: dict[str, dict[str, bool]] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)

    def failing(self) -> list[str]:
        return [f"{cap}.{test}: {self.errors.get((cap, test), '')}"
                for cap, tests in sorted(self.checks.items())
                for test, ok in tests.items() if not ok]

    def table(self) -> str:
        rows = []
        for cap, tests in sorted(self.checks.items()):
            passed = sum(tests.values())
            rows.append(f"  {cap:16} {passed}/{len(tests)} passed")
        return f"{self.name}: detected {sorted(self.detected)}\n" + "\n".join(rows)


async def conformance(name: str, make: Callable[[], AbstractAsyncContextManager[Any]]
                      ) -> Outcome:
    outcome = Outcome(name)

    def on_result(cap: str, test: str, passed: bool, error: str | None) -> None:
        outcome.checks.setdefault(cap, {})[test] = passed
        if error:  # the traceback: its last line says what was wrong
            outcome.errors[cap, test] = error.rstrip().splitlines()[-1]

    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[Any]:
        async with make() as saver:
            yield saver

    report = await validate(factory, progress=ProgressCallbacks(on_test_result=on_result))
    outcome.detected = {cap for cap, result in report.results.items() if result.detected}
    return outcome


def run_both(name: str, dsn: str | None) -> tuple[Outcome, Outcome]:
    """The suite on the saver alone, then on the guard around it."""
    face: Callable[[BaseCheckpointSaver[Any]], BaseCheckpointSaver[Any]] = (
        async_face if name in ("SqliteSaver", "PostgresSaver") else (lambda s: s))

    @asynccontextmanager
    async def bare() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        async with official(name, dsn) as saver:
            yield face(saver)

    @asynccontextmanager
    async def guarded() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        async with official(name, dsn) as saver:
            yield face(StateGuardCheckpointer(saver))

    async def both() -> tuple[Outcome, Outcome]:
        return (await conformance(name, bare),
                await conformance(f"StateGuardCheckpointer({name})", guarded))

    return asyncio.run(both())


@pytest.fixture(params=sorted(EXPECTED))
def saver_name(request: pytest.FixtureRequest) -> Iterator[tuple[str, str | None]]:
    name: str = request.param
    yield name, request.getfixturevalue("pg_dsn") if name in POSTGRES else None


def test_the_guard_conforms_wherever_its_saver_does(saver_name: tuple[str, str | None]) -> None:
    name, dsn = saver_name
    bare, guard = run_both(name, dsn)

    assert bare.detected == EXPECTED[name], bare.table()
    assert not bare.failing(), "the reference itself fails:\n" + "\n".join(bare.failing())
    assert guard.detected == bare.detected, (
        f"the guard hides or claims capabilities of {name}:\n{bare.table()}\n{guard.table()}\n"
        + "\n".join(guard.failing()))
    assert guard.checks == bare.checks, (
        f"the guard around {name} fails checks the saver passes:\n"
        + "\n".join(guard.failing()) + f"\n\n{bare.table()}\n{guard.table()}")


def test_the_guard_class_has_its_savers_capabilities_no_more() -> None:
    # Asked of the class (as the suite and LangGraph ask): what the saver lacks, the guard lacks,
    # answering as the saver does; what it has, the guard forwards.
    sqlite_guard = StateGuardCheckpointer(SqliteSaver(sqlite3.connect(":memory:")))
    for method in ("prune", "aprune", "copy_thread", "adelete_for_runs"):
        assert not has(type(sqlite_guard), method)
    assert all(has(type(sqlite_guard), m) for m in ("put", "aput", "list", "alist"))
    with pytest.raises(NotImplementedError):
        sqlite_guard.prune(["t"])
    assert isinstance(sqlite_guard, StateGuardCheckpointer)
    assert type(sqlite_guard).__name__ == "StateGuardCheckpointer"
    assert type(StateGuardCheckpointer()) is type(StateGuardCheckpointer(InMemorySaver()))

    class PruningSaver(InMemorySaver):
        def prune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:
            pass

    pruning_guard = StateGuardCheckpointer(PruningSaver())
    assert has(type(pruning_guard), "prune") and not has(type(pruning_guard), "aprune")
    assert type(copy.copy(pruning_guard)) is type(pruning_guard)  # a copy keeps its class
