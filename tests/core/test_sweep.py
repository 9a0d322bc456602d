"""``guard.sweep``: the runs no process drives are recovered under their policy, each once,
however many sweepers run at once (in this process; across processes and a killed worker:
test_sweep_processes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.config import get_config
from langgraph.graph import START, StateGraph
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from stateguard import (
    Compensation,
    CompensationRetry,
    ConfigurationError,
    InMemoryJournal,
    Journal,
    RetryLater,
    RunStatus,
    SqliteJournal,
    StateGuardCheckpointer,
)
from stateguard.postgres_journal import PostgresJournal
from stateguard.records import RunRecord
from tests.core.support import LineState, config, line_builder

NODES = ["a", "b", "c", "d"]


class Stores:
    """What several guards (as several processes would) share: a journal and a saver, in
    memory (one guard, shared), in SQLite files, or in a PostgreSQL schema of the test's own."""

    def __init__(self, kind: str, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.kind, self.tmp, self.request = kind, tmp, request
        self._memory = (InMemorySaver(), InMemoryJournal()) if kind == "memory" else None
        self._closing: list[Callable[[], None]] = []
        if kind == "postgres":
            db, schema = request.getfixturevalue("pg_journal_db"), \
                request.getfixturevalue("pg_schema")
            self.journal_args = (db, schema)
            self.saver_dsn = make_conninfo(db, options=f"-c search_path={schema}")
            with PostgresJournal(db, schema=schema) as journal:
                journal.setup()  # and the schema the saver's tables go in
            self.saver().setup()

    def journal(self) -> Journal:
        if self._memory is not None:
            return self._memory[1]
        if self.kind == "sqlite":
            return SqliteJournal(self.tmp / "journal.db")
        db, schema = self.journal_args
        journal = PostgresJournal(db, schema=schema, max_connections=2)
        self._closing.append(journal.close)
        return journal

    def saver(self) -> BaseCheckpointSaver[Any]:
        if self._memory is not None:
            return self._memory[0]
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.tmp / "cp.db", check_same_thread=False)
            self._closing.append(conn.close)
            return SqliteSaver(conn)
        pg = psycopg.connect(self.saver_dsn, autocommit=True, prepare_threshold=0,
                             row_factory=dict_row)
        self._closing.append(pg.close)
        return PostgresSaver(pg)  # type: ignore[arg-type]

    def close(self) -> None:
        for close in reversed(self._closing):
            close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    made = Stores(request.param, tmp_path, request)
    try:
        yield made
    finally:
        made.close()


class World:
    """a -> b -> c -> d, each an effect, each undone (c's undo is safe when c is in doubt).
    While ``crash_at`` names a node, that node stops its process's run as a Ctrl-C does: the
    run is left running, its lease released, the node in doubt, for a sweeper."""

    def __init__(self) -> None:
        self.effects: list[str] = []  # "<run>:<node>" and "<run>:undo:<node>"
        self.crash_at: str | None = "c"

    def builder(self) -> Any:
        world = self

        class Effects(list[str]):
            def append(self, node: str) -> None:
                if node == world.crash_at:
                    raise KeyboardInterrupt
                run_id = get_config()["configurable"]["thread_id"]
                world.effects.append(f"{run_id}:{node}")

        return line_builder(NODES, Effects())

    def undo(self, node: str) -> Callable[[dict[str, Any], Any], bool]:
        def compensation(state: dict[str, Any], ctx: Any) -> bool:
            self.effects.append(f"{ctx.run_id}:undo:{node}")
            return True
        return compensation

    def guard(self, stores: Stores, **settings: Any) -> tuple[StateGuardCheckpointer, Any]:
        compensations: dict[str, Any] = {n: self.undo(n) for n in NODES}
        compensations["c"] = Compensation(self.undo("c"), in_doubt_safe=True)
        guard = StateGuardCheckpointer(stores.saver(), journal=stores.journal(),
                                       compensations={**compensations,
                                                      **settings.pop("compensations", {})},
                                       **settings)
        return guard, guard.compile(self.builder())

    def run(self, guard: StateGuardCheckpointer, graph: Any, run_id: str) -> None:
        """Invoke the run; when it crashes, it is left for a sweeper."""
        with contextlib.suppress(KeyboardInterrupt):
            guard.invoke(graph, {}, config(run_id))

    def of(self, run_id: str) -> list[str]:
        return [e.split(":", 1)[1] for e in self.effects if e.startswith(f"{run_id}:")]


def test_it_unwinds_a_run_let_go_of_mid_step_once_and_leaves_the_others(
        stores: Stores) -> None:
    world = World()
    guard, graph = world.guard(stores)
    world.run(guard, graph, "dropped")
    world.crash_at = None
    world.run(guard, graph, "finished")
    assert guard.status("dropped").run.status == RunStatus.RUNNING

    assert guard.sweep(graph).recovered == []  # changed just now: give it a lease (60 s)
    report = guard.sweep(graph, idle=0)

    assert report.recovered == [("dropped", RunStatus.COMPENSATED)], report
    assert world.of("dropped") == ["a", "b", "undo:c", "undo:b", "undo:a"]
    assert world.of("finished") == NODES
    assert str(guard.sweep(graph, idle=0)) == "nothing to recover"
    assert world.of("dropped") == ["a", "b", "undo:c", "undo:b", "undo:a"]  # once


def test_it_resumes_the_runs_its_policy_says_to(stores: Stores) -> None:
    world = World()
    guard, graph = world.guard(stores)
    world.run(guard, graph, "resume-me")
    world.run(guard, graph, "undo-me")
    world.crash_at = None  # whatever stopped c is gone

    def policy(run: RunRecord) -> bool:
        return run.run_id.startswith("resume")

    report = guard.sweep(graph, idle=0, resume=policy)

    assert sorted(report.recovered) == [("resume-me", RunStatus.SUCCEEDED),
                                        ("undo-me", RunStatus.COMPENSATED)]
    assert world.of("resume-me") == NODES  # c in doubt ran again, and once: it never had
    assert world.of("undo-me") == ["a", "b", "undo:c", "undo:b", "undo:a"]


def test_it_leaves_a_run_someone_held_after_it_was_listed(stores: Stores) -> None:
    # A sweeper lists the run; another recovers it first, and b's refund now waits an hour
    # (RetryLater): the first one, taking the run's lease afterwards, must not run that
    # round early. Its fencing token moved twice since the list: someone else held it.
    world = World()
    fails = CompensationRetry(attempts=1, later=RetryLater(initial=3600, cap=3600))

    def refund_b(state: dict[str, Any], ctx: Any) -> bool:
        world.effects.append(f"{ctx.run_id}:undo:b failed")
        raise ConnectionError("provider down")

    guard, graph = world.guard(stores, compensations={"b": Compensation(refund_b,
                                                                         retry=fails)})
    world.run(guard, graph, "t")
    journal = guard.journal
    assert hasattr(journal, "runs_abandoned")
    listed = journal.runs_abandoned(idle=0, limit=10)

    assert guard.sweep(graph, idle=0).recovered == [("t", RunStatus.COMPENSATING)]
    late = StateGuardCheckpointer(guard.saver, journal=journal,
                                  compensations=guard.core.spec.compensations)
    late_graph = late.compile(world.builder())
    late.core.journal = _Listing(journal, listed)  # type: ignore[assignment]
    report = late.sweep(late_graph, idle=0)

    assert report.recovered == [] and report.skipped == [
        ("t", "held by another process since it was listed")]
    assert world.of("t") == ["a", "b", "undo:c", "undo:b failed", "undo:a"]
    assert guard.sweep(graph, idle=0).recovered == []  # its round is not due


class _Listing:
    """A journal whose list of abandoned runs is the one given (read before something else
    happened to them)."""

    def __init__(self, journal: Journal, listed: list[RunRecord]) -> None:
        self._journal, self._listed = journal, listed

    def runs_abandoned(self, *, idle: float, limit: int) -> list[RunRecord]:
        return self._listed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)


def test_it_runs_the_next_round_of_waiting_compensations_when_it_is_due(
        stores: Stores) -> None:
    world = World()
    outage = {"on": True}

    def refund_b(state: dict[str, Any], ctx: Any) -> bool:
        if outage["on"]:
            raise ConnectionError("provider down")
        world.effects.append(f"{ctx.run_id}:undo:b")
        return True

    retry = CompensationRetry(attempts=1, later=RetryLater(initial=1.0, cap=1.0))
    guard, graph = world.guard(stores, compensations={"b": Compensation(refund_b,
                                                                         retry=retry)})
    world.run(guard, graph, "t")
    round_started = time.monotonic()
    assert guard.sweep(graph, idle=0).recovered == [("t", RunStatus.COMPENSATING)]
    round_ended = time.monotonic()  # the round failed between the two
    outage["on"] = False
    early = guard.sweep(graph, idle=0).recovered
    # Not due for 1 s after the failed round: a sweep within it leaves the run alone. (A
    # machine too busy to sweep twice within 1 s proves nothing either way.)
    if time.monotonic() - round_started < 1.0:
        assert early == []
    time.sleep(max(0.0, round_ended + 1.05 - time.monotonic()))

    assert early + guard.sweep(graph, idle=0).recovered == [("t", RunStatus.COMPENSATED)]
    assert world.of("t") == ["a", "b", "undo:c", "undo:a", "undo:b"]


def test_concurrent_sweepers_recover_each_run_exactly_once(stores: Stores) -> None:
    world = World()
    guard, graph = world.guard(stores)
    runs = [f"r{i}" for i in range(8)]
    for run_id in runs:
        world.run(guard, graph, run_id)
    sweepers = [world.guard(stores) for _ in range(4)] if stores.kind != "memory" else [
        (guard, graph)] * 4
    start, reports, errors = threading.Barrier(4), [], []

    def sweep(sweeper: StateGuardCheckpointer, its_graph: Any) -> None:
        try:
            start.wait(10)
            reports.append(sweeper.sweep(its_graph, idle=0))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sweep, args=pair) for pair in sweepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == [] and all(r.failed == [] for r in reports), (errors, reports)
    recovered = sorted(run for report in reports for run, _ in report.recovered)
    assert recovered == runs  # each by one sweeper
    for run_id in runs:
        assert world.of(run_id) == ["a", "b", "undo:c", "undo:b", "undo:a"], run_id


def test_it_sweeps_a_cancelled_async_run_on_the_callers_event_loop() -> None:
    effects: list[str] = []
    started = asyncio.Event()

    async def charge(state: dict[str, Any]) -> dict[str, Any]:
        effects.append("charge")
        return {}

    async def slow(state: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(30)
        return {}

    async def refund(state: dict[str, Any], ctx: Any) -> bool:
        effects.append("refund")
        return True

    guard = StateGuardCheckpointer(compensations={"charge": refund})
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(LineState)
    builder.add_node("charge", charge)
    builder.add_node("slow", slow)
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "slow")
    graph = guard.compile(builder)

    async def main() -> Any:
        run = asyncio.create_task(guard.ainvoke(graph, {}, config("t")))
        await asyncio.wait_for(started.wait(), 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        return await guard.asweep(graph, idle=0)

    report = asyncio.run(main())
    assert report.recovered == [("t", RunStatus.COMPENSATED)]
    assert effects == ["charge", "refund"]


def test_it_refuses_what_it_cannot_sweep_with() -> None:
    world = World()
    stores = Stores("memory", Path("."), None)  # type: ignore[arg-type]
    guard, graph = world.guard(stores)
    other, _ = World().guard(Stores("memory", Path("."), None))  # type: ignore[arg-type]
    for bad, message in [({"limit": 0}, "limit must be a positive int"),
                         ({"idle": -1}, "idle must be a number of seconds"),
                         ({"resume": "yes"}, "resume must be True, False, or a function"),
                         ({"match": "r-"}, "match must be a function"),
                         ({"config": "t"}, "config must be a RunnableConfig")]:
        with pytest.raises(ConfigurationError, match=message):
            guard.sweep(graph, **bad)
    with pytest.raises(ConfigurationError):
        other.sweep(graph)  # a graph of another guard

    class Bare:
        """A journal of the protocol alone: it cannot list abandoned runs."""

        def __init__(self) -> None:
            self._inner = InMemoryJournal()

        def __getattr__(self, name: str) -> Any:
            if name == "runs_abandoned":
                raise AttributeError(name)
            return getattr(self._inner, name)

    bare = StateGuardCheckpointer(journal=Bare())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cannot list abandoned runs"):
        bare.sweep(bare.compile(world.builder()))
