"""A guarded graph on a PostgresJournal and LangGraph's PostgresSaver, for the tests that run
workers and sweepers as processes of their own (test_sweep_processes.py).

    python -m tests.core.sweep_procs THREAD [--hang-at NODE] [--slow-at NODE]

runs the graph on THREAD as a worker: a -> b -> c -> d. ``--hang-at`` stops in that node (the
test kills the process there), ``--slow-at`` sleeps 2.5 s in it (longer than the lease: the
heartbeat must keep the run). ``make_graph`` is the graph for ``stateguard sweep --graph``.
The environment names the stores: SWEEP_TEST_DSN (the database), SWEEP_TEST_SCHEMA (the
journal's schema, the saver's tables in it too), SWEEP_TEST_EFFECTS (the file every effect and
compensation appends a line to, "<thread>:<node>", "<thread>:undo:<node>"), SWEEP_TEST_LEASE.
"""

from __future__ import annotations

import argparse
import operator
import os
import sys
import time
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from stateguard import Compensation, CompensationRetry, Journal, StateGuardCheckpointer
from stateguard.postgres_journal import PostgresJournal

NODES = ["a", "b", "c", "d"]


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    hang_at: str
    slow_at: str


def log(line: str) -> None:
    fd = os.open(os.environ["SWEEP_TEST_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def node(name: str) -> Any:
    def body(state: State) -> dict[str, Any]:
        thread = get_config()["configurable"]["thread_id"]
        if state.get("hang_at") == name:
            log(f"{thread}:started:{name}")
            time.sleep(60)  # killed here
        if state.get("slow_at") == name:
            time.sleep(2.5)
        log(f"{thread}:{name}")
        return {"log": [name]}
    return body


def undo(name: str) -> Any:
    def compensation(state: dict[str, Any], ctx: Any) -> bool:
        log(f"{ctx.run_id}:undo:{name}")
        return True
    return compensation


def make_graph(*, saver: Any, journal: Journal) -> Any:
    """The graph the workers run, as ``stateguard sweep --graph`` wants it."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(State)
    for name in NODES:
        builder.add_node(name, node(name))
    for a, b in zip([START, *NODES], [*NODES, END], strict=True):
        builder.add_edge(a, b)
    compensations: dict[str, Any] = {n: undo(n) for n in NODES}
    compensations["c"] = Compensation(undo("c"), in_doubt_safe=True)
    guard = StateGuardCheckpointer(
        saver, journal=journal, compensations=compensations,
        compensation_retry=CompensationRetry(attempts=2, initial=0.001),
        lease_ttl=float(os.environ.get("SWEEP_TEST_LEASE", "60")))
    return guard.compile(builder)


def saver_conninfo(env: Mapping[str, str] = os.environ) -> str:
    """The database, with the journal's schema first on the search path: the saver's tables."""
    return make_conninfo(env["SWEEP_TEST_DSN"],
                         options=f"-c search_path={env['SWEEP_TEST_SCHEMA']}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("thread")
    parser.add_argument("--hang-at")
    parser.add_argument("--slow-at")
    args = parser.parse_args(argv)
    inputs = {k: v for k, v in (("hang_at", args.hang_at), ("slow_at", args.slow_at)) if v}
    with psycopg.connect(saver_conninfo(), autocommit=True, prepare_threshold=0,
                         row_factory=dict_row) as conn, \
            PostgresJournal(os.environ["SWEEP_TEST_DSN"],
                            schema=os.environ["SWEEP_TEST_SCHEMA"]) as journal:
        graph = make_graph(saver=PostgresSaver(conn), journal=journal)
        graph.checkpointer.invoke(graph, inputs, {"configurable": {"thread_id": args.thread}})
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
