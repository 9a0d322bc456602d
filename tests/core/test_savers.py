"""The guard wraps the official savers: in-memory, SQLite (sync and async) and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command, interrupt

from stateguard import InvalidRunState, RunStatus, SagaAborted, StateGuardCheckpointer
from tests.core.support import config, line_builder, undo

NODES = ["a", "b", "c"]
def check_unwinds(guard: StateGuardCheckpointer, effects: list[str], thread: str) -> None:
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(SagaAborted):
        guard.invoke(graph, {"fail_at": "c"}, config(thread))
    assert effects == ["a", "b", "undo:b", "undo:a"]
    assert graph.get_state(config(thread)).values["log"] == ["a", "b"]


def test_it_works_with_a_sqlite_saver_file(tmp_path: Path) -> None:
    effects: list[str] = []
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    guard = StateGuardCheckpointer(SqliteSaver(conn),
                                   compensations={n: undo(effects, n) for n in NODES})
    check_unwinds(guard, effects, "sqlite")


def test_it_works_with_a_postgres_saver(pg_dsn: str) -> None:
    effects: list[str] = []
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        guard = StateGuardCheckpointer(saver, compensations={n: undo(effects, n) for n in NODES})
        check_unwinds(guard, effects, "pg")
        # the drop-in form on the same saver
        effects.clear()
        graph = line_builder(NODES, effects).compile(checkpointer=guard)
        with pytest.raises(ValueError):
            graph.invoke({"fail_at": "c"}, config("pg-dropin"), durability="sync")
        assert effects == ["a", "b", "undo:b", "undo:a"]


async def test_it_runs_async_with_an_async_sqlite_saver(tmp_path: Path) -> None:
    effects: list[str] = []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as saver:
        guard = StateGuardCheckpointer(saver, compensations={n: undo(effects, n) for n in NODES})
        graph = guard.compile(line_builder(NODES, effects))
        with pytest.raises(SagaAborted):
            await guard.ainvoke(graph, {"fail_at": "c"}, config("async"))
        assert effects == ["a", "b", "undo:b", "undo:a"]
        out = await guard.ainvoke(graph, {}, config("async-ok"))
        assert out["log"] == NODES
        assert guard.status("async-ok").run.status == RunStatus.SUCCEEDED


async def test_it_observes_a_drop_in_ainvoke_with_an_async_postgres_saver(pg_dsn: str) -> None:
    effects: list[str] = []
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        guard = StateGuardCheckpointer(saver, compensations={n: undo(effects, n) for n in NODES})
        graph = line_builder(NODES, effects).compile(checkpointer=guard)
        with pytest.raises(ValueError) as caught:
            await graph.ainvoke({"fail_at": "c"}, config("apg"), durability="sync")
        assert effects == ["a", "b", "undo:b", "undo:a"]
        assert caught.value.stateguard_report.compensated == ["b", "a"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", ["runner", "plain"])
async def test_it_resumes_and_decides_gates_on_an_async_only_saver(tmp_path: Path,
                                                                    form: str) -> None:
    # An async saver has no sync reads (they would block its own event loop): every step of a
    # resume and of each operator action reads through the async API.
    effects: list[str] = []

    def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": [f"ask:{interrupt('go on?')}"]}

    builder = line_builder(["a", "b"], effects)
    builder.add_node("ask", ask)
    builder.edges.discard(("a", "b"))
    builder.add_edge("a", "ask")
    builder.add_edge("ask", "b")
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as saver:
        guard = StateGuardCheckpointer(saver, approvals=["b"],
                                       compensations={"a": undo(effects, "a")})
        graph = guard.compile(builder)

        async def call(input: Any) -> Any:
            if form == "runner":
                return await guard.ainvoke(graph, input, config("g"))
            return await graph.ainvoke(input, config("g"))

        assert "__interrupt__" in await call({})  # the graph's own interrupt()
        assert "__interrupt__" in await call(Command(resume="yes"))  # now the gate of b
        with pytest.raises(InvalidRunState, match="approve"):
            await call(Command(resume=True))
        await guard.aapprove(graph, config("g"), by="alice")
        assert effects == ["a", "b"]
        report = await guard.acompensate(graph, config("g"))
        assert report.compensated == ["a"] and effects == ["a", "b", "undo:a"]


# -- the saver's other capabilities, forwarded -----------------------------------------------

def test_it_forwards_prune_and_keeps_or_forgets_the_saga_record_by_strategy(pg_dsn: str) -> None:
    effects: list[str] = []
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        guard = StateGuardCheckpointer(saver, compensations={n: undo(effects, n) for n in NODES})
        graph = guard.compile(line_builder(NODES, effects))
        for thread in ("kept", "gone"):
            guard.invoke(graph, {}, config(thread))
        assert len(list(saver.list(config("kept")))) > 1

        guard.prune(["kept"])  # older checkpoints go; the saga's record stays
        assert len(list(saver.list(config("kept")))) == 1
        assert [s.node for s in guard.status("kept").steps] == NODES
        assert graph.get_state(config("kept")).values["log"] == NODES

        guard.prune(["gone"], strategy="delete")  # the thread goes, and its run with it
        assert list(saver.list(config("gone"))) == []
        assert guard.journal.run_get("gone") is None
        assert guard.journal.run_get("kept") is not None


async def test_it_forwards_aprune_of_an_async_saver(pg_dsn: str) -> None:
    effects: list[str] = []
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        guard = StateGuardCheckpointer(saver, compensations={n: undo(effects, n) for n in NODES})
        graph = line_builder(NODES, effects).compile(checkpointer=guard)
        await graph.ainvoke({}, config("apruned"), durability="sync")

        await guard.aprune(["apruned"])
        assert len([c async for c in saver.alist(config("apruned"))]) == 1
        assert guard.status("apruned").run.status == RunStatus.SUCCEEDED


def test_it_says_what_its_saver_cannot_do_as_the_saver_says_it() -> None:
    saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    guard = StateGuardCheckpointer(saver)
    for call in (lambda s: s.copy_thread("a", "b"), lambda s: s.delete_for_runs(["r"]),
                 lambda s: s.prune(["a"])):
        with pytest.raises(NotImplementedError):
            call(saver)
        with pytest.raises(NotImplementedError):
            call(guard)
