"""P1: what the guard adds per step. A 20-node linear graph, guarded vs bare LangGraph with the
same saver (sync durability), rounds interleaved so machine noise hits both sides alike.

    .venv/bin/python bench/p1_overhead.py [--runs 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from stateguard import SqliteJournal, StateGuardCheckpointer

N = 20


class S(TypedDict):
    x: int


def builder() -> StateGraph[Any, Any, Any, Any]:
    b: StateGraph[Any, Any, Any, Any] = StateGraph(S)
    names = [f"n{i}" for i in range(N)]
    for name in names:
        b.add_node(name, lambda s: {"x": s["x"] + 1})
    for a, c in zip([START, *names], [*names, END], strict=True):
        b.add_edge(a, c)
    return b


def positive(state: dict[str, Any]) -> bool:
    return bool(state.get("x", 0) >= 0)


def undo(state: dict[str, Any], ctx: Any) -> bool:
    return True


def guard_kwargs() -> dict[str, Any]:
    return {"invariants": [positive], "compensations": {f"n{i}": undo for i in range(N)}}


def time_one(invoke: Callable[[dict[str, Any], dict[str, Any]], Any]) -> float:
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    start = time.perf_counter()
    invoke({"x": 0}, config)
    return time.perf_counter() - start


def _no_runner(config: dict[str, Any]) -> dict[str, Any]:
    from stateguard.instrument import RUNNER_KEY

    return {"configurable": {**config["configurable"], RUNNER_KEY: True}}


def variants(tmp: Path) -> dict[str, Callable[[dict[str, Any], dict[str, Any]], Any]]:
    out: dict[str, Callable[[dict[str, Any], dict[str, Any]], Any]] = {}
    bare_mem = builder().compile(checkpointer=InMemorySaver())
    out["bare InMemorySaver"] = lambda i, c: bare_mem.invoke(i, c, durability="sync")
    g = StateGuardCheckpointer(InMemorySaver(), **guard_kwargs())
    guarded_mem = g.compile(builder())
    out["guarded InMemorySaver"] = lambda i, c: g.invoke(guarded_mem, i, c)
    # The same guarded graph without the runner (no lease, run status or final check): the
    # wrappers' share of the cost inside a real graph.
    out["guarded InMemorySaver, wrappers only"] = lambda i, c: guarded_mem.invoke(i, _no_runner(c))
    d = StateGuardCheckpointer(InMemorySaver(), **guard_kwargs())
    dropin_mem = builder().compile(checkpointer=d)
    # The drop-in form: the same wrappers, plus the lease and the turn's end at the loop's exit.
    out["drop-in InMemorySaver"] = lambda i, c: dropin_mem.invoke(i, c, durability="sync")

    def sqlite_saver(name: str) -> SqliteSaver:
        return SqliteSaver(sqlite3.connect(tmp / name, check_same_thread=False))

    bare_sql = builder().compile(checkpointer=sqlite_saver("bare.db"))
    out["bare SqliteSaver"] = lambda i, c: bare_sql.invoke(i, c, durability="sync")
    gs = StateGuardCheckpointer(sqlite_saver("guarded.db"), **guard_kwargs())
    guarded_sql = gs.compile(builder())
    out["guarded SqliteSaver"] = lambda i, c: gs.invoke(guarded_sql, i, c)
    gj = StateGuardCheckpointer(sqlite_saver("journaled.db"),
                                journal=SqliteJournal(tmp / "journal.db"), **guard_kwargs())
    journaled = gj.compile(builder())
    out["guarded SqliteSaver + SqliteJournal"] = lambda i, c: gj.invoke(journaled, i, c)
    return out


def wrapper_cost(calls: int = 20000) -> float:
    """Seconds the node wrapper adds per call, measured on one node outside the graph loop:
    the wrapped node against the same node unwrapped, same config, interleaved."""
    plain = builder().compile()
    guarded = StateGuardCheckpointer(**guard_kwargs()).compile(builder())
    inner, outer = plain.nodes["n0"].bound, guarded.nodes["n0"].bound
    best = {"inner": float("inf"), "outer": float("inf")}
    for round_ in range(5):
        for name, node in (("inner", inner), ("outer", outer)):
            start = time.perf_counter()
            for i in range(calls):
                node.invoke({"x": i}, {"configurable": {
                    "thread_id": "w", "__pregel_task_id": f"{round_}-{name}-{i}"}})
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best["outer"] - best["inner"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runners = variants(Path(tmp))
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for invoke in runners.values():  # warm up
            time_one(invoke)
        # Interleave single runs, so that the machine's noise falls on every variant alike,
        # and compare medians of many single runs.
        for _ in range(args.rounds):
            for _ in range(args.runs):
                for name, invoke in runners.items():
                    samples[name].append(time_one(invoke))
    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"node wrapper alone: {wrapper_cost() * 1e6:.1f} us added per step "
          "(best of 5 x 20000 calls, wrapped vs unwrapped node)")
    print(f"P1: {N}-node linear graph, {args.runs * args.rounds} runs per variant, single runs "
          "interleaved across variants, median per run")
    print(f"{'configuration':40} {'ms/run':>8} {'us/step':>8} {'added us/step':>14} {'ratio':>6}")
    for name, seconds in med.items():
        base = med["bare InMemorySaver" if "InMemory" in name else "bare SqliteSaver"]
        added = (seconds - base) / N * 1e6
        print(f"{name:40} {seconds * 1e3:8.2f} {seconds / N * 1e6:8.0f} {added:14.1f} "
              f"{seconds / base:6.2f}")


if __name__ == "__main__":
    main()
