"""What a GET /metrics scrape costs the database on a big journal (docs/deploy.md, Monitoring).

    .venv/bin/python bench/metrics_scrape.py [--steps 1000000] [--scrapes 20] [--per-scrape 100]

Fills the database ``stateguard_metrics_bench`` (created and migrated; refilled only when its
step count differs from ``--steps``) with runs of five steps (four agents; 80 % succeeded,
10 % compensated with compensations and attempts, the rest open), then times
``JournalCollector.collect()``: a new process's first scrape (reads the whole journal once),
and steady scrapes with ``--per-scrape`` new finished runs (five steps each) written before
each one, spread over 15 s of a clock that the collector reads (about 7 runs/s with a scrape
every 15 s): each scrape then reads what a real one would.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB = "stateguard_metrics_bench"
os.environ.update(DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB}",
                  REDIS_URL="redis://127.0.0.1:6379/3", DJANGO_SETTINGS_MODULE=
                  "stateguard_web.settings", DEBUG="false", SECRET_KEY="bench-" + "x" * 50)
sys.path.insert(0, str(ROOT))

RUNS = """
INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,
                       idempotency_key, submission_hash, created_at, updated_at, finished_at)
SELECT gen_random_uuid(), (ARRAY['checkout','provision','refund','noop5'])[1 + i %% 4],
       jsonb_build_object('customer', 'cus_' || i, 'amount', i %% 1000),
       CASE WHEN i %% 100 < 80 THEN 'succeeded' WHEN i %% 100 < 90 THEN 'compensated'
            WHEN i %% 100 < 93 THEN 'needs_attention' WHEN i %% 100 < 96 THEN 'failed'
            WHEN i %% 100 < 98 THEN 'paused' ELSE 'running' END,
       '', 1, '', '', now() - %(age)s::interval + i * %(gap)s::interval,
       now() - %(age)s::interval + i * %(gap)s::interval,
       now() - %(age)s::interval + i * %(gap)s::interval + random() * interval '60 seconds'
FROM generate_series(1, %(runs)s) i"""
STEPS = """
INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at,
                        finished_at, done_seq, "update", state_after)
SELECT r.id, 'task-' || r.id || '-' || s, r.agent || '_node' || s, '[]', 'succeeded', 1,
       r.created_at + s * interval '1 second',
       r.created_at + s * interval '1 second' + exp(random() * 6 - 4) * interval '1 second',
       s, jsonb_build_object('k' || s, repeat('x', 80)),
       jsonb_build_object('customer', 'cus_' || r.id, 'blob', repeat('y', 500))
FROM sagas_run r, generate_series(1, 5) s WHERE r.id > %(after)s"""
COMPENSATIONS = """
INSERT INTO sagas_compensation (run_id, step_id, node, idempotency_key, status, triggered_by,
                                created_at, updated_at)
SELECT s.run_id, s.id, s.node, 'idem-' || s.id,
       CASE WHEN r.status = 'needs_attention' AND s.done_seq = 1 THEN 'failed'
            ELSE 'succeeded' END, 'automatic', r.updated_at, r.updated_at
FROM sagas_step s JOIN sagas_run r ON r.id = s.run_id
WHERE r.status IN ('compensated', 'needs_attention') AND s.done_seq <= 3;
INSERT INTO sagas_compensationattempt (compensation_id, number, started_at, finished_at, ok,
                                       result)
SELECT c.id, 1, c.created_at, c.created_at + interval '50 ms', c.status = 'succeeded', ''
FROM sagas_compensation c"""


def fill(cursor: object, steps: int) -> None:
    runs = steps // 5
    cursor.execute("TRUNCATE sagas_run CASCADE")  # type: ignore[attr-defined]
    cursor.execute(RUNS, {"runs": runs, "age": "30 days",  # type: ignore[attr-defined]
                          "gap": f"{30 * 86400 / runs} seconds"})
    cursor.execute(STEPS, {"after": 0})  # type: ignore[attr-defined]
    cursor.execute(COMPENSATIONS)  # type: ignore[attr-defined]
    cursor.execute("VACUUM ANALYZE")  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--per-scrape", type=int, default=100)
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres",
                         autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            admin.execute(f"CREATE DATABASE {DB}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)

    import django

    django.setup()
    from django.db import connection

    from stateguard_web.monitoring.journal_metrics import JournalCollector

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM sagas_step")
        if cursor.fetchone()[0] != args.steps:
            start = time.perf_counter()
            fill(cursor.cursor, args.steps)
            print(f"filled {args.steps} steps in {time.perf_counter() - start:.0f} s")
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('sagas_step')), "
                       "(SELECT count(*) FROM sagas_run)")
        size, runs = cursor.fetchone()
    print(f"journal: {args.steps} steps ({size} with indexes), {runs} runs")

    # A clock that moves 15 s per scrape, so that each scrape finds what 15 s of traffic left
    # (rows written in the virtual future, at the virtual "now").
    clock = [datetime.now(UTC)]
    collector = JournalCollector(clock=lambda: clock[0])
    start = time.perf_counter()
    list(collector.collect())
    print(f"first scrape of a process (whole journal): "
          f"{1000 * (time.perf_counter() - start):.0f} ms")

    times = []
    for _ in range(args.scrapes):
        with connection.cursor() as cursor:  # 15 s of new runs, five steps each
            cursor.execute("SELECT max(id) FROM sagas_run")
            after = cursor.fetchone()[0]
            cursor.execute(RUNS.replace("now() - %(age)s::interval", "%(start)s"),
                           {"runs": args.per_scrape, "start": clock[0],
                            "gap": f"{15 / args.per_scrape} seconds"})
            cursor.execute(STEPS, {"after": after})
        clock[0] += timedelta(seconds=15)
        start = time.perf_counter()
        list(collector.collect())
        times.append(1000 * (time.perf_counter() - start))
    times.sort()
    print(f"steady scrapes ({args.per_scrape} new runs before each): median "
          f"{statistics.median(times):.1f} ms, max {times[-1]:.1f} ms over {len(times)}")


if __name__ == "__main__":
    main()
