"""Retention (runs/retention.py): what a purge gives back, and what it costs the readers.

1. Bytes per 1000 checkout runs: ``--checkout`` real checkout runs (a quarter of them set to fail
   their booking, so they unwind and are compensated) run in this process as a worker runs them
   (``tasks.run_execute``), against localstripe; then every run is made 31 days old and purged
   with {succeeded: 30d, compensated: 30d}. The sizes (``pg_total_relation_size``: table, TOAST
   and indexes) of the journal's and LangGraph's checkpoint tables, each after ``VACUUM FULL`` so
   that they count what the rows hold, not the free space PostgreSQL keeps for new rows, before
   and after the purge. Every checkout run charges, so each keeps a thin row for its effects.
2. A large purge under reads: ``--synthetic`` runs bulk-made in SQL (steps, an approval, audit
   events, checkpoints, blobs and writes; half with an effect), all due, purged in batches of
   ``--batch`` while a reader thread reads as the API does (a run by its code with its steps,
   and the runs list's first page), against a baseline of the same reads with no purge: p50 and
   p99 before and during (it reads one bulk run in 50, changed just now so that the purge
   keeps it: the same work before and during). A sampler reads ``pg_stat_activity`` every
   20 ms for backends waiting on a lock, and reports the longest wait seen.

A database of its own (``stateguard_bench_retention``, dropped, created and migrated), Redis
database 10.

    .venv/bin/python bench/retention.py [--checkout 1000] [--synthetic 100000] [--batch 500]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import databases
from bench.procs import start_localstripe, stop

DB = "stateguard_bench_retention"
TABLES = ("sagas_run", "sagas_step", "sagas_compensation", "sagas_compensationattempt",
          "sagas_approval", "sagas_effect", "sagas_auditevent", "sagas_notification",
          "checkpoints", "checkpoint_blobs", "checkpoint_writes")

SYNTHETIC = """
INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token, request,
                       idempotency_key, submission_hash, created_at, updated_at, finished_status)
SELECT gen_random_uuid(), 'bulk', '{"email": "a@b.co", "amount": 4200}',
       CASE WHEN i % 4 = 0 THEN 'compensated' ELSE 'succeeded' END, '', 1, NULL, '', '',
       now() - interval '60 days' + i * interval '1 ms', now() - interval '60 days', ''
FROM generate_series(1, {n}) AS i;
INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at, finished_at,
                        done_seq, update, state_after, kind)
SELECT r.id, 't' || s, 'node' || s, '[]', 'succeeded', 1, r.created_at, r.created_at, s,
       '{"x": 1}', jsonb_build_object('email', 'a@b.co', 'amount', 4200, 'step', s,
                                      'note', repeat('x', 200)), 'compensatable'
FROM sagas_run AS r, generate_series(1, 4) AS s WHERE r.agent = 'bulk';
INSERT INTO sagas_approval (run_id, step_id, node, payload, status, decided_by, reason,
                            requested_at, decided_at)
SELECT id, 't2', 'node2', '{}', 'approved', 'alice', '', created_at, created_at
FROM sagas_run WHERE agent = 'bulk';
INSERT INTO sagas_effect (run_id, step_id, node, provider, kind, external_id, amount, currency,
                          idempotency_key, undoes, status, recorded_at)
SELECT id, 't2', 'node2', 'stripe', 'charge', 'ch_' || code, 4200, 'usd', '', '',
       CASE WHEN status = 'compensated' THEN 'compensated' ELSE 'applied' END, created_at
FROM sagas_run WHERE agent = 'bulk' AND id % 2 = 0;
INSERT INTO sagas_auditevent (run_id, run_code, actor, action, data, created_at)
SELECT id, code, 'alice', 'run.submitted', '{}', created_at FROM sagas_run WHERE agent = 'bulk';
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type,
                         checkpoint, metadata)
SELECT code::text, '', 'c' || c, CASE WHEN c > 1 THEN 'c' || (c - 1) END, NULL,
       jsonb_build_object('v', 4, 'id', 'c' || c, 'channel_values', jsonb_build_object(
           'note', repeat('y', 300))), '{"source": "loop"}'
FROM sagas_run, generate_series(1, 5) AS c WHERE agent = 'bulk';
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT code::text, '', 'messages', 'v' || c, 'msgpack', convert_to(repeat('z', 400), 'UTF8')
FROM sagas_run, generate_series(1, 3) AS c WHERE agent = 'bulk';
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
                               type, blob, task_path)
SELECT code::text, '', 'c' || c, 'task' || c, 0, 'x', 'msgpack',
       convert_to(repeat('w', 100), 'UTF8'), ''
FROM sagas_run, generate_series(1, 4) AS c WHERE agent = 'bulk';
"""


def sizes(cursor: Any, vacuum: bool) -> dict[str, int]:
    if vacuum:
        for table in TABLES:
            cursor.execute(f"VACUUM FULL ANALYZE {table}")
    cursor.execute("SELECT c, pg_total_relation_size(c::regclass) FROM unnest(%s::text[]) AS c",
                   [list(TABLES)])
    return dict(cursor.fetchall())


def checkout_bytes(runs: int, policy: Any) -> None:
    from django.db import connection, connections
    from django.db.models import Count

    from stateguard_web.runs import retention, runtime, services, tasks
    from stateguard_web.sagas.models import Run

    rng = random.Random(1)
    started = time.perf_counter()
    for i in range(runs):
        run = services.run_submit(agent="checkout", input={
            "email": f"u{i}@b.co", "amount": 42_00, "fail_booking": rng.random() < 0.25})
        tasks.run_execute(run.pk)
    statuses = dict(Run.objects.values_list("status").annotate(n=Count("pk")))
    print(f"{runs} checkout runs in {time.perf_counter() - started:.0f} s: {statuses}")
    Run.objects.update(updated_at=time_ago(31))
    # Let go of every connection the runs used: a session left in a transaction would keep
    # VACUUM FULL from removing the deleted rows, and the sizes would not move.
    runtime.close()
    connections.close_all()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, state, backend_xmin, application_name FROM pg_stat_activity"
                       " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        if others := cursor.fetchall():
            print(f"other sessions on {DB} (may hold back VACUUM): {others}")
        before = sizes(cursor, vacuum=True)
        outcome = retention.purge_runs(policy=policy)
        after_plain = sum(sizes(cursor, vacuum=False).values())
        after = sizes(cursor, vacuum=True)
    print(f"purged {outcome.runs} runs ({outcome.thinned} thin rows kept for their effects, "
          f"{outcome.deleted} deleted) in {outcome.batches} batches")
    print(f"{'table':28} {'before':>10} {'after':>10}   bytes per 1000 runs")
    for table in TABLES:
        print(f"{table:28} {before[table] * 1000 // runs:>10} {after[table] * 1000 // runs:>10}")
    total_b, total_a = sum(before.values()), sum(after.values())
    print(f"{'total':28} {total_b * 1000 // runs:>10} {total_a * 1000 // runs:>10}"
          f"   ({100 * (1 - total_a / total_b):.0f}% less; before VACUUM FULL the files stay "
          f"{after_plain * 1000 // runs} per 1000, their space reused by new rows)")


def time_ago(days: int) -> Any:
    from django.utils import timezone

    return timezone.now() - timedelta(days=days)


class Reader(threading.Thread):
    """Reads as the API's GETs do, in a loop, recording each read's seconds."""

    def __init__(self, codes: list[str]) -> None:
        super().__init__(daemon=True)
        self.codes, self.samples, self.stop = codes, [], threading.Event()

    def run(self) -> None:
        from django.db import connection

        from stateguard_web.runs import selectors
        from stateguard_web.sagas.models import Run

        rng = random.Random(2)
        try:
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    run = selectors.run_get(code=rng.choice(self.codes), detail=True)
                    selectors.run_detail(run=run)
                except Exception:  # purged meanwhile: a 404 is a read too
                    pass
                list(selectors.run_list(runs=Run.objects.all())[:50])
                self.samples.append(time.perf_counter() - start)
        finally:
            connection.close()


class LockSampler(threading.Thread):
    """The longest time a backend of this database was seen waiting on a lock."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop, self.longest, self.seen = dsn, threading.Event(), 0.0, 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT count(*), COALESCE(max(extract(epoch FROM now() - state_change)), 0)"
                    " FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                    [DB]).fetchone()
                assert row is not None
                self.seen += row[0]
                self.longest = max(self.longest, float(row[1]))
                time.sleep(0.02)


def percentiles(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms ({len(samples)} reads)"


def big_purge(n: int, policy: Any, baseline_seconds: float) -> None:
    from django.db import connection
    from django.db.models.expressions import RawSQL

    from stateguard_web.runs import retention
    from stateguard_web.sagas.models import Run

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(SYNTHETIC.replace("{n}", str(int(n))))  # several statements: no parameters
        cursor.execute("ANALYZE")
    print(f"\n{n} synthetic runs made in {time.perf_counter() - started:.0f} s "
          f"({Run.objects.count()} runs in all)")
    # What the readers ask for: one bulk run in 50, changed now, so kept by the purge: the same
    # reads before and during it (a purged run would be a cheap miss).
    Run.objects.filter(agent="bulk", id__in=RawSQL(
        "SELECT id FROM sagas_run WHERE agent = 'bulk' AND id %% 50 = 0", [])).update(
        updated_at=time_ago(0))
    codes = [str(c) for c in Run.objects.filter(agent="bulk", updated_at__gt=time_ago(1))
             .values_list("code", flat=True)]
    reader = Reader(codes)
    reader.start()
    time.sleep(baseline_seconds)
    baseline = list(reader.samples)
    sampler = LockSampler(f"postgresql://postgres@127.0.0.1:5432/{DB}")
    sampler.start()
    mark = len(reader.samples)
    started = time.perf_counter()
    outcome = retention.purge_runs(policy=policy)
    took = time.perf_counter() - started
    during = reader.samples[mark:]
    reader.stop.set()
    sampler.stop.set()
    reader.join()
    sampler.join()
    print(f"purged {outcome.runs} runs in {outcome.batches} batches of {policy.batch} in "
          f"{took:.0f} s ({outcome.runs / took:.0f} runs/s; {outcome.thinned} thin rows kept)")
    print(f"reads before: {percentiles(baseline)}")
    print(f"reads during: {percentiles(during)}")
    print(f"lock waits seen: {sampler.seen} samples, longest {sampler.longest * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=int, default=1000, help="real checkout runs")
    parser.add_argument("--synthetic", type=int, default=100_000, help="bulk-made runs")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--baseline", type=float, default=10.0, help="seconds of reads alone")
    args = parser.parse_args()
    log_dir = Path(f"/tmp/{DB}")
    log_dir.mkdir(exist_ok=True)
    stripe, stripe_url = start_localstripe(log_dir)
    os.environ.update(
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{DB}",
        REDIS_URL="redis://127.0.0.1:6379/10", DEBUG="false", SECRET_KEY="bench-" + "x" * 50,
        DJANGO_SETTINGS_MODULE="stateguard_web.settings", STATEGUARD_ENV_FILE="",
        STRIPE_API_KEY="sk_test_bench", STRIPE_API_BASE=stripe_url,
        STATEGUARD_SANDBOX_DIR=str(log_dir / "sandbox"))
    try:
        databases.recreate(DB)
        import django

        django.setup()
        from stateguard_web.runs import retention

        policy = retention.Policy(keep={"succeeded": timedelta(days=30),
                                        "compensated": timedelta(days=30)},
                                  ledger=None, batch=args.batch)
        if args.checkout:
            checkout_bytes(args.checkout, policy)
        if args.synthetic:
            big_purge(args.synthetic, policy, args.baseline)
    finally:
        stop(stripe)


if __name__ == "__main__":
    main()
