"""P2: runs per second of five-step no-op runs executed by one Celery worker with 2 processes on
local PostgreSQL + Redis, against the ceiling of the same graph, saver and sync durability in a
bare Celery task (no guard, journal or lease). Rounds alternate so noise hits both alike.

    .venv/bin/python bench/p2_throughput.py [--runs 1000] [--rounds 2]

Uses the database ``stateguard_bench`` (created, migrated and emptied) and Redis database 3.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Production settings: DEBUG off (Django would keep and format every query).
os.environ.update(DATABASE_URL="postgres://postgres@127.0.0.1:5432/stateguard_bench",
                  REDIS_URL="redis://127.0.0.1:6379/3", DJANGO_SETTINGS_MODULE=
                  "stateguard_web.settings", DEBUG="false", SECRET_KEY="bench-" + "x" * 50,
                  STATEGUARD_BENCH_AGENTS="true")  # the noop5 agent; the worker inherits it
sys.path.insert(0, str(ROOT))


def setup_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = 'stateguard_bench'"
                             ).fetchone():
            admin.execute("CREATE DATABASE stateguard_bench")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)
    # Every run of the script starts from empty tables: earlier runs' rows (tens of thousands of
    # runs and checkpoints) would make each write a little dearer, run after run. No ANALYZE:
    # with autovacuum off (as on this machine), statistics taken of empty tables would keep the
    # plans on sequential scans while the tables grow (measured: PostgreSQL CPU per run x4).
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/stateguard_bench",
                         autocommit=True) as bench:
        bench.execute("TRUNCATE sagas_run, sagas_step, sagas_compensation,"
                      " sagas_compensationattempt, sagas_approval, sagas_auditevent, checkpoints,"
                      " checkpoint_blobs, checkpoint_writes CASCADE")  # + refs to runs


def guarded_round(n: int, cpu: dict[str, list[float]]) -> float:
    from django.db.models import Max, Min

    from stateguard_web.runs import tasks
    from stateguard_web.sagas.models import Run, Step

    runs = Run.objects.bulk_create([Run(agent="noop5", input={"n": 0}) for _ in range(n)])
    mark = cpu_seconds()
    for run in runs:
        tasks.run_execute.delay(run.pk)
    # The rate comes from the journal's timestamps: polling seldom, over the id range (the
    # runs were created together), keeps the poll from competing with the workers.
    batch = Run.objects.filter(pk__gte=runs[0].pk, pk__lte=runs[-1].pk)
    while batch.exclude(status="succeeded").exists():
        failed = batch.exclude(status__in=["pending", "running", "succeeded"]).first()
        if failed is not None:
            raise SystemExit(f"a benchmark run did not succeed: {failed}")
        time.sleep(1)
    record_cpu(cpu, mark, n)
    first = Step.objects.filter(run__in=batch).aggregate(t=Min("started_at"))["t"]
    last = batch.aggregate(t=Max("updated_at"))["t"]
    return n / (last - first).total_seconds()


def bare_round(n: int, cpu: dict[str, list[float]]) -> float:
    import redis
    from django.conf import settings

    from bench.bare_tasks import bare_run

    batch = uuid.uuid4().hex
    mark = cpu_seconds()
    for _ in range(n):
        bare_run.delay(batch)
    r = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    while r.llen(f"bench:{batch}") < n:
        time.sleep(1)
    record_cpu(cpu, mark, n)
    spans = [tuple(map(float, x.split())) for x in r.lrange(f"bench:{batch}", 0, -1)]
    return n / (max(e for _, e in spans) - min(s for s, _ in spans))


def cpu_seconds() -> dict[str, float]:
    """CPU time used so far by the worker processes, PostgreSQL and Redis (all of their
    processes), to see where a round's time goes."""
    import psutil

    used = {"worker": 0.0, "postgres": 0.0, "redis": 0.0}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        name, cmd = proc.info["name"] or "", " ".join(proc.info["cmdline"] or ())
        kind = ("postgres" if name.startswith("postgres") else "redis" if "redis" in name
                else "worker" if "celery" in cmd and "worker" in cmd else None)
        if kind and proc.info["cpu_times"]:
            used[kind] += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return used


def record_cpu(cpu: dict[str, list[float]], mark: dict[str, float], n: int) -> None:
    """CPU milliseconds per run since ``mark``. Backends that exited meanwhile are missing."""
    for kind, used in cpu_seconds().items():
        cpu.setdefault(kind, []).append((used - mark[kind]) / n * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    setup_database()
    import django

    django.setup()
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "stateguard_web", "worker", "-c", "2",
         "--include", "bench.bare_tasks", "-l", "warning", "--without-mingle",
         "--without-gossip"], cwd=ROOT, start_new_session=True,
        stdout=open("/tmp/p2-worker.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        time.sleep(5)  # let the worker come up
        guarded_round(50, {})  # warm up: savers set up, graphs compiled, connections open
        bare_round(50, {})
        results: dict[str, list[float]] = {"guarded": [], "bare": []}
        cpu: dict[str, dict[str, list[float]]] = {"guarded": {}, "bare": {}}
        for _ in range(args.rounds):
            results["guarded"].append(guarded_round(args.runs, cpu["guarded"]))
            results["bare"].append(bare_round(args.runs, cpu["bare"]))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    guarded, bare = (statistics.median(results[k]) for k in ("guarded", "bare"))
    print(f"P2: {args.runs} five-step runs x {args.rounds} alternating rounds, 1 worker x 2 "
          "processes, PostgreSQL + Redis")
    print(f"  guarded (StateGuard: journal, lease, fencing) {guarded:7.1f} runs/s  "
          f"{results['guarded']}")
    print(f"  ceiling (bare Celery task, same saver)         {bare:7.1f} runs/s  "
          f"{results['bare']}")
    rounds = [g / b for g, b in zip(results["guarded"], results["bare"], strict=True)]
    print(f"  ratio {guarded / bare:.2f} (round by round: "
          f"{', '.join(f'{r:.2f}' for r in rounds)})")
    for kind in ("guarded", "bare"):
        print(f"  CPU ms per run, {kind}: " + ", ".join(
            f"{k} {statistics.median(v):.2f}" for k, v in cpu[kind].items()))


if __name__ == "__main__":
    main()
