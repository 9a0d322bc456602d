"""P2's steadiest number: CPU per run (this process + every PostgreSQL process), guarded web task
against the bare graph on the same saver, in one process without Celery, in short paired rounds.

    .venv/bin/python bench/p2_cpu.py [--runs 40] [--rounds 25]

The throughput benchmark (``p2_throughput.py``) swings by +-8 % per round on this shared machine;
here each round runs both sides back to back, so the ratio of a round compares like with like;
the median over many short rounds still moves by ~5 % between runs of the script. Without
Celery's own cost per task on both sides, the ratio reads higher than P2's CPU ratio.
Uses the database ``stateguard_bench`` (see ``p2_throughput.py``) and Redis database 3.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.p2_throughput import cpu_seconds, setup_database  # sets the environment too


def cpu_per_run(side: Callable[[int], None], n: int) -> tuple[float, float]:
    """Milliseconds of CPU per run: this process (all its threads), PostgreSQL."""
    process, postgres = time.process_time(), cpu_seconds()["postgres"]
    side(n)
    return ((time.process_time() - process) / n * 1e3,
            (cpu_seconds()["postgres"] - postgres) / n * 1e3)


def guarded(n: int) -> None:
    from stateguard_web.runs import tasks
    from stateguard_web.sagas.models import Run

    for run in Run.objects.bulk_create([Run(agent="noop5", input={"n": 0}) for _ in range(n)]):
        tasks.run_execute.run(run.pk)  # the task's body, as a worker runs it


def bare(n: int) -> None:
    from bench.bare_tasks import _graph

    graph = _graph()
    for _ in range(n):
        graph.invoke({"n": 0}, {"configurable": {"thread_id": str(uuid.uuid4())}},
                     durability="sync")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    setup_database()
    import django

    django.setup()
    guarded(20)  # warm up: graphs compiled, connections open
    bare(20)
    rounds = [(cpu_per_run(bare, args.runs), cpu_per_run(guarded, args.runs))
              for _ in range(args.rounds)]
    ratios = {"in all": [sum(g) / sum(b) for b, g in rounds],
              "process": [g[0] / b[0] for b, g in rounds],
              "PostgreSQL": [g[1] / b[1] for b, g in rounds]}
    print(f"P2 CPU: {args.rounds} paired rounds of {args.runs} five-step runs, one process")
    for name, index in (("bare", 0), ("guarded", 1)):
        print(f"  {name:8} ms per run: process "
              f"{statistics.median(r[index][0] for r in rounds):.2f}, PostgreSQL "
              f"{statistics.median(r[index][1] for r in rounds):.2f}")
    for name, values in ratios.items():
        low, _, high = statistics.quantiles(values, n=4)
        print(f"  guarded / bare, {name:10} {statistics.median(values):.3f} "
              f"(quartiles {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()
