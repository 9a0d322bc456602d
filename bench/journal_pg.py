"""What a step's journal writes cost on PostgresJournal beside SqliteJournal, and what that adds
to a guarded step with LangGraph's PostgresSaver.

1. The journal alone: ``step_start`` + ``step_finish`` of one step (two durable writes), per
   journal; the floor beside it is two ``INSERT``s in autocommit (two commits) on the same
   server.
2. A guarded 20-node line (``guard.compile`` + ``guard.invoke``, sync durability) on
   PostgresSaver, with InMemoryJournal (the saver alone), SqliteJournal and PostgresJournal:
   ms per step.

Many short rounds, each taking one sample of every variant in turn, so that a burst of the
machine's noise (a shared disk's fsyncs) hits the variants alike; medians of the samples. A
database of its own (stateguard_pgj_bench), dropped at the end.

    .venv/bin/python bench/journal_pg.py [--steps 50] [--runs 3] [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.p1_overhead import N, builder  # P1's 20-node line
from stateguard import InMemoryJournal, Journal, SqliteJournal, StateGuardCheckpointer
from stateguard.postgres_journal import PostgresJournal
from stateguard.records import StepStatus

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB = "stateguard_pgj_bench"
DSN = f"postgresql://postgres@127.0.0.1:5432/{DB}"


def journal_step(journal: Journal, steps: int) -> float:
    """Seconds per step (start + finish) over ``steps`` steps of a fresh run."""
    run = str(uuid.uuid4())
    journal.run_begin(run)
    start = time.perf_counter()
    for i in range(steps):
        journal.step_start(run, f"s{i}", "node")
        journal.step_finish(run, f"s{i}", StepStatus.SUCCEEDED, update={"x": i},
                            state_after={"x": i})
    return (time.perf_counter() - start) / steps


def floor_step(conn: psycopg.Connection[Any], steps: int) -> float:
    """Two INSERTs, each its own commit: the least two durable writes can cost."""
    start = time.perf_counter()
    for i in range(steps):
        conn.execute("INSERT INTO floor (v) VALUES (%s)", (i,))
        conn.execute("INSERT INTO floor (v) VALUES (%s)", (i,))
    return (time.perf_counter() - start) / steps


def graph_step(guard: StateGuardCheckpointer, graph: Any, runs: int) -> float:
    """Seconds per step of the guarded line, over ``runs`` runs."""
    start = time.perf_counter()
    for _ in range(runs):
        guard.invoke(graph, {"x": 0}, {"configurable": {"thread_id": str(uuid.uuid4())}})
    return (time.perf_counter() - start) / runs / N


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50, help="journal steps per sample")
    parser.add_argument("--runs", type=int, default=3, help="guarded runs per sample")
    parser.add_argument("--rounds", type=int, default=40, help="samples of each variant")
    args = parser.parse_args()
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                psycopg.connect(DSN, autocommit=True) as floor, \
                psycopg.connect(DSN, autocommit=True, prepare_threshold=0,
                                row_factory=dict_row) as saver_conn, \
                PostgresJournal(DSN) as pg:
            run(args, Path(tmp), floor, saver_conn, pg)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


def run(args: argparse.Namespace, tmp: Path, floor: psycopg.Connection[Any],
        saver_conn: psycopg.Connection[Any], pg: PostgresJournal) -> None:
    pg.setup()
    floor.execute("CREATE TABLE floor (v integer)")
    saver = PostgresSaver(saver_conn)  # type: ignore[arg-type]
    saver.setup()
    sqlite = SqliteJournal(tmp / "journal.db")
    journals: dict[str, Callable[[], float]] = {
        "floor: two INSERTs, two commits (PostgreSQL)": lambda: floor_step(floor, args.steps),
        "SqliteJournal (file, WAL)": lambda: journal_step(sqlite, args.steps),
        "PostgresJournal": lambda: journal_step(pg, args.steps),
    }
    guards = {name: StateGuardCheckpointer(saver, journal=journal)
              for name, journal in (("InMemoryJournal (the saver alone)", InMemoryJournal()),
                                    ("SqliteJournal", SqliteJournal(tmp / "guarded.db")),
                                    ("PostgresJournal", pg))}
    graphs = {name: guard.compile(builder()) for name, guard in guards.items()}
    for name in guards:  # warm up: imports, prepared statements, caches
        graph_step(guards[name], graphs[name], 3)
    for measure in journals.values():
        measure()
    raw: dict[str, list[float]] = {name: [] for name in journals}
    per_step: dict[str, list[float]] = {name: [] for name in guards}
    for _ in range(args.rounds):
        for name, measure in journals.items():
            raw[name].append(measure())
        for name in guards:
            per_step[name].append(graph_step(guards[name], graphs[name], args.runs))
    show(f"1. journal writes per step (start + finish), {args.rounds} samples of {args.steps}"
         " steps, medians:", raw, "us", 1e6)
    show(f"2. guarded {N}-node line on PostgresSaver (sync), {args.rounds} samples of"
         f" {args.runs} runs, medians:", per_step, "ms/step", 1e3)


def show(title: str, seconds: dict[str, list[float]], unit: str, scale: float) -> None:
    """Each variant's median, and its ratio to the first (the floor, or the saver alone)."""
    print(title)
    first = statistics.median(next(iter(seconds.values())))
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"   {name:48s} {median * scale:9.3f} {unit}  {median / first:5.2f}x")


if __name__ == "__main__":
    main()
