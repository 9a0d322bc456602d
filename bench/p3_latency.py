"""P3: time from a node's exception to the first compensation call, guarded and drop-in.

    .venv/bin/python bench/p3_latency.py [--runs 300]
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from stateguard import SagaAborted, SqliteJournal, StateGuardCheckpointer

raised_at: list[float] = []
latencies: list[float] = []


class S(TypedDict, total=False):
    x: int


def charge(state: dict[str, Any]) -> dict[str, Any]:
    return {"x": 1}


def ship(state: dict[str, Any]) -> dict[str, Any]:
    raised_at.append(time.perf_counter())
    raise RuntimeError("ship failed")


def refund(state: dict[str, Any], ctx: Any) -> bool:
    if ctx.attempt == 1:
        latencies.append(time.perf_counter() - raised_at[-1])
    return True


def builder() -> StateGraph[Any, Any, Any, Any]:
    b: StateGraph[Any, Any, Any, Any] = StateGraph(S)
    b.add_node("charge", charge)
    b.add_node("ship", ship)
    b.add_edge(START, "charge")
    b.add_edge("charge", "ship")
    b.add_edge("ship", END)
    return b


def measure(name: str, run: Any, runs: int) -> None:
    latencies.clear()
    for _ in range(runs):
        with contextlib.suppress(SagaAborted, RuntimeError):
            run({"configurable": {"thread_id": str(uuid.uuid4())}})
    ms = sorted(v * 1e3 for v in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"{name:45} n={len(ms):4} p50 {statistics.median(ms):6.2f} ms  p99 {p99:6.2f} ms  "
          f"max {ms[-1]:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        g1 = StateGuardCheckpointer(InMemorySaver(), compensations={"charge": refund})
        graph1 = g1.compile(builder())
        measure("guarded, InMemorySaver", lambda c: g1.invoke(graph1, {}, c), args.runs)
        saver = SqliteSaver(sqlite3.connect(Path(tmp) / "cp.db", check_same_thread=False))
        g2 = StateGuardCheckpointer(saver, journal=SqliteJournal(Path(tmp) / "j.db"),
                                    compensations={"charge": refund})
        graph2 = g2.compile(builder())
        measure("guarded, SqliteSaver + SqliteJournal", lambda c: g2.invoke(graph2, {}, c),
                args.runs)
        g3 = StateGuardCheckpointer(InMemorySaver(), compensations={"charge": refund})
        graph3 = builder().compile(checkpointer=g3)
        measure("drop-in, InMemorySaver, async durability", lambda c: graph3.invoke({}, c),
                args.runs)


if __name__ == "__main__":
    main()
