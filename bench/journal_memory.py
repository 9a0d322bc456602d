"""What the default journal (InMemoryJournal, as the guard makes it) keeps per finished run: the
bytes Python allocated for it (tracemalloc), for a 3-node graph and for a 2-tool agent, with each
thread's checkpoints deleted after its run so that only the journal's share is counted (the
InMemorySaver keeps every checkpoint until delete_thread; that is LangGraph's, and separate).

    .venv/bin/python bench/journal_memory.py [--runs 300]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stateguard import StateGuardCheckpointer
from tests.core.agent_support import Travel, agent, ask, go, say
from tests.core.support import line_builder, undo


def per_run(make: Callable[[StateGuardCheckpointer, int], None], guard: StateGuardCheckpointer,
            runs: int) -> float:
    for i in range(20):  # warm up: imports, caches
        make(guard, i)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(20, 20 + runs):
        make(guard, i)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / runs


def line_run(guard: StateGuardCheckpointer, i: int) -> None:
    graph = line_builder(["charge", "email", "ship"], []).compile(checkpointer=guard)
    graph.invoke({"balance": 10}, {"configurable": {"thread_id": f"t{i}"}})
    guard.saver.delete_thread(f"t{i}")


def agent_run(world: Travel) -> Callable[[StateGuardCheckpointer, int], None]:
    def run(guard: StateGuardCheckpointer, i: int) -> None:
        script: list[Any] = [ask(("charge_card", {"amount": 40_00})),
                             ask(("book_flight", {"destination": "Oslo"})), say("booked")]
        graph = agent("v2", world, script, checkpointer=guard)
        graph.invoke(go(), {"configurable": {"thread_id": f"t{i}"}})
        guard.saver.delete_thread(f"t{i}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    line_guard = StateGuardCheckpointer(compensations={"charge": undo([], "charge")})
    world = Travel()
    agent_guard = StateGuardCheckpointer(compensations={"charge_card": world.refund})
    print(f"3-node graph: {per_run(line_run, line_guard, args.runs) / 1024:.1f} KiB per run")
    print(f"2-tool agent (7 steps): "
          f"{per_run(agent_run(world), agent_guard, args.runs) / 1024:.1f} KiB per run")


if __name__ == "__main__":
    main()
