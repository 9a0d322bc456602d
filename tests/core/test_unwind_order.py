"""Order and completeness of the unwind under load, in the drop-in form: LangGraph hands the
saver's writes to a thread pool, where a call may overtake an earlier one, and a sibling may still
be running when another branch raised. The wrappers journal each step as its body returns, and the
unwind waits for LangGraph's loop to finish every task, so neither changes what is undone."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from psycopg_pool import ConnectionPool

from stateguard import (
    CompensationStatus,
    InMemoryJournal,
    RunStatus,
    SqliteJournal,
    StateGuardCheckpointer,
)
from tests.core.support import FAST_RETRY, LineState, config

RUNS_UNDER_LOAD = 200
THREADS, ROUNDS = 20, 10  # PostgreSQL; SQLite serialises its writers, so fewer rounds there
SQLITE_ROUNDS = 5


def loop_builder(effects: list[str], lock: threading.Lock | None = None
                 ) -> StateGraph[Any, Any, Any, Any]:
    """A router loop: ``charge`` three times (ch1, ch2, ch3), then ``book``, which raises."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def charge(state: dict[str, Any]) -> dict[str, Any]:
        charge_id = f"ch{len(state.get('log', [])) + 1}"
        if lock is None:
            effects.append(charge_id)
        return {"log": [charge_id], "charge_id": charge_id}

    def book(state: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("no seats")

    builder.add_node("charge", charge)
    builder.add_node("book", book)
    builder.add_edge(START, "charge")
    builder.add_conditional_edges(
        "charge", lambda s: "charge" if len(s["log"]) < 3 else "book", ["charge", "book"])
    builder.add_edge("book", END)
    return builder


def refund_into(undone: list[str]) -> Any:
    def refund(state: dict[str, Any], ctx: Any) -> bool:
        undone.append(state["charge_id"])  # the state just after that charge's own writes
        return True
    return refund


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Another process that keeps every core busy, as on a loaded server."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class Jitter:
    """Makes a saver's writes take a little longer some times than others, like a database
    over a network: LangGraph's pool then finishes them in another order more often."""

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        time.sleep(random.uniform(0, 0.002))
        super().put_writes(config, writes, task_id, task_path)  # type: ignore[misc]


class JitterySaver(Jitter, InMemorySaver):
    pass


class JitteryPostgresSaver(Jitter, PostgresSaver):
    pass


@pytest.mark.slow  # other processes load every core
def test_it_undoes_a_loops_charges_newest_first_under_cpu_load(cpu_load: None) -> None:
    undone: list[str] = []
    guard = StateGuardCheckpointer(JitterySaver(),
                                   compensations={"charge": refund_into(undone)},
                                   compensation_retry=FAST_RETRY)
    graph = loop_builder([]).compile(checkpointer=guard)
    wrong: list[tuple[int, list[str]]] = []
    for i in range(RUNS_UNDER_LOAD):
        undone.clear()
        durability = "sync" if i % 2 else "async"
        with pytest.raises(ValueError, match="no seats") as caught:
            graph.invoke({}, config(f"load-{i}"), durability=durability)
        report = caught.value.stateguard_report  # type: ignore[attr-defined]
        if undone != ["ch3", "ch2", "ch1"] or len(report.compensated) != 3:
            wrong.append((i, list(undone)))
    assert wrong == []


def hammer(saver: Any, journal: Any, prefix: str, rounds: int = ROUNDS) -> list[str]:
    """THREADS threads x ROUNDS rounds of the loop through one guard; the wrong orders seen."""
    undone: dict[str, list[str]] = {}
    lock = threading.Lock()

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        with lock:
            undone.setdefault(ctx.run_id, []).append(state["charge_id"])
        return True

    guard = StateGuardCheckpointer(saver, journal=journal, compensations={"charge": refund},
                                   compensation_retry=FAST_RETRY)
    graph = loop_builder([], lock).compile(checkpointer=guard)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        for r in range(rounds):
            try:
                graph.invoke({}, config(f"{prefix}-{t}-{r}"), durability="sync")
            except ValueError:
                continue
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            errors.append(AssertionError("the run did not fail"))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == []
    assert len(undone) == THREADS * rounds
    return [f"{run}: {order}" for run, order in sorted(undone.items())
            if order != ["ch3", "ch2", "ch1"]]


@pytest.mark.slow  # 20 threads x 5 rounds
def test_it_keeps_the_order_for_20_threads_through_one_guard_on_sqlite(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    try:
        assert hammer(SqliteSaver(conn), SqliteJournal(tmp_path / "j.db"), "sqlite",
                      SQLITE_ROUNDS) == []
    finally:
        conn.close()


@pytest.mark.slow  # 20 threads x 10 rounds
def test_it_keeps_the_order_for_20_threads_through_one_guard_on_postgres(
        pg_dsn: str) -> None:
    with ConnectionPool(pg_dsn, min_size=4, max_size=THREADS,
                        kwargs={"autocommit": True, "prepare_threshold": 0}) as pool:
        saver = JitteryPostgresSaver(pool)  # type: ignore[arg-type]
        saver.setup()
        assert hammer(saver, InMemoryJournal(), "pg") == []


def fork_with_slow_sibling(effects: list[str], started: threading.Event
                           ) -> StateGraph[Any, Any, Any, Any]:
    """``book`` raises while its sibling ``charge`` is still inside the provider's call."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def charge(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        time.sleep(0.3)  # a slow provider
        effects.append("charge")
        return {"log": ["charge"], "charge_id": "ch1"}

    def book(state: dict[str, Any]) -> dict[str, Any]:
        assert started.wait(5)
        raise ValueError("no seats")

    builder.add_node("reserve", lambda s: effects.append("reserve") or {"log": ["reserve"]})
    builder.add_node("charge", charge)
    builder.add_node("book", book)
    builder.add_edge(START, "reserve")
    for name in ("charge", "book"):
        builder.add_edge("reserve", name)
        builder.add_edge(name, END)
    return builder


def test_it_undoes_a_sibling_still_running_when_another_branch_raised_in_one_unwind(
        saver: Any) -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer(
        saver, compensations={n: lambda s, c, n=n: effects.append(f"undo:{n}") or True
                              for n in ("reserve", "charge")},
        compensation_retry=FAST_RETRY)
    graph = fork_with_slow_sibling(effects, threading.Event()).compile(checkpointer=guard)

    with pytest.raises(ValueError, match="no seats") as caught:
        graph.invoke({}, config("fork"), durability="sync")

    assert effects == ["reserve", "charge", "undo:charge", "undo:reserve"]
    report = caught.value.stateguard_report  # type: ignore[attr-defined]
    assert (report.reason, report.compensated) == ("error", ["charge", "reserve"])
    view = guard.status("fork")
    assert view.run.status == RunStatus.COMPENSATED
    assert [c.triggered_by for c in view.compensations] == ["automatic"] * 2
    assert all(len(c.attempts) == 1 for c in view.compensations)


def pay_then_route(effects: list[str]) -> StateGraph[Any, Any, Any, Any]:
    """``pay`` charges; the router after it raises."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)

    def pay(state: dict[str, Any]) -> dict[str, Any]:
        effects.append("pay")
        return {"log": ["pay"], "charge_id": "ch1"}

    def route(state: dict[str, Any]) -> str:
        raise KeyError("no route for this basket")

    builder.add_node("pay", pay)
    builder.add_node("ship", lambda s: {"log": ["ship"]})
    builder.add_edge(START, "pay")
    builder.add_conditional_edges("pay", route, ["ship", END])
    builder.add_edge("ship", END)
    return builder


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_it_undoes_a_node_whose_router_raised_after_its_body_ran(
        saver: Any, durability: str) -> None:
    effects: list[str] = []
    refunded: list[str] = []

    def refund(state: dict[str, Any], ctx: Any) -> bool:
        refunded.append(state["charge_id"])
        return True

    guard = StateGuardCheckpointer(saver, compensations={"pay": refund},
                                   compensation_retry=FAST_RETRY)
    graph = pay_then_route(effects).compile(checkpointer=guard)
    with pytest.raises(KeyError, match="no route") as caught:
        graph.invoke({}, config("route"), durability=durability)

    assert refunded == ["ch1"]
    assert caught.value.stateguard_report.compensated == ["pay"]  # type: ignore[attr-defined]
    view = guard.status("route")
    assert view.run.status == RunStatus.COMPENSATED
    assert [c.status for c in view.compensations] == [CompensationStatus.SUCCEEDED]


async def test_it_runs_async_compensations_on_the_callers_event_loop() -> None:
    # An app's clients (httpx.AsyncClient, asyncpg pools, asyncio locks) belong to its loop.
    caller = asyncio.get_running_loop()
    client_lock = asyncio.Lock()  # bound to the caller's loop on first use
    seen: list[Any] = []

    async def refund(state: dict[str, Any], ctx: Any) -> bool:
        seen.append(asyncio.get_running_loop())
        async with client_lock:
            await asyncio.sleep(0)
        return True

    async def slow_use() -> None:
        async with client_lock:
            await asyncio.sleep(0.05)

    guard = StateGuardCheckpointer(compensations={"pay": refund}, compensation_retry=FAST_RETRY)
    graph = pay_then_route([]).compile(checkpointer=guard)
    user = asyncio.create_task(slow_use())  # the lock is busy when the refund needs it
    await asyncio.sleep(0)
    with pytest.raises(KeyError) as caught:
        await graph.ainvoke({}, config("aroute"), durability="sync")
    await user

    assert seen == [caller]
    assert caught.value.stateguard_report.compensated == ["pay"]  # type: ignore[attr-defined]
