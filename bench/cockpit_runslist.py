"""The runs list (issue 23, section 6) on 100 000 runs and 2 000 000 steps: each order, two
statuses at once, a page deep in an order, the API, and the CSV export.

    .venv/bin/python bench/cockpit_runslist.py [--runs 100000] [--steps 20] [--rounds 5]
                                               [--requests 20] [--exports 5] [--no-load]

A database of ``--runs`` runs over the last 30 days (four agents; 96 % succeeded or
compensated, the rest failed, needing attention, paused, pending or running), each with
``--steps`` steps, and with the times the list shows and sorts by: created, started (seconds
to minutes after), finished (for an outcome) and updated. Then VACUUM ANALYZE (what autovacuum
does in production; this machine's PostgreSQL has it off). The paused runs wait for an
approval each, and the checkout runs that succeeded had one, decided: the navigation counts
them on every page (``cockpit.APPROVALS``).

Each view is asked for as an operator through Django's test client (the server's time, no
network), ``--rounds`` rounds of ``--requests`` requests per view, interleaved, with the plan
of every query (EXPLAIN (ANALYZE, BUFFERS)) and the ``sagas_`` tables a plan reads by a
sequential scan named (``cockpit.measure``); the floor is a trivial JSON view behind
the same middleware. Then ``--exports`` CSV exports of ``STATEGUARD_RUNS_CSV_MAX_ROWS`` rows
(the default, 10 000), read to their last byte. Last, what the index on ``updated_at``
(migration 0027) costs each journal write, which sets it (``index_cost``).

Uses its own database ``stateguard_cockpit_runslist`` (dropped and created) and Redis database
7. Results: docs/benchmarks.md ("Runs list").
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# cockpit_incidents sets its own database on import: this bench's is set after it.
from bench import databases  # noqa: E402
from bench.cockpit import (  # noqa: E402
    APPROVALS,
    arguments,
    measure,
    operator_after,
    pct,
    report,
    timed,
)
from bench.cockpit_incidents import ENV  # noqa: E402

DB_NAME = "stateguard_cockpit_runslist"
os.environ.update({**ENV, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
                   "REDIS_URL": "redis://127.0.0.1:6379/7"})

VIEWS = {
    "floor (trivial view)": "/bench/floor",
    "newest first (the default)": "/",
    "oldest first": "/?sort=created",
    "by agent": "/?sort=agent",
    "by agent, Z first": "/?sort=-agent",
    "by status": "/?sort=status",
    "by status, page 40": "/?sort=status&page=40",
    "failed + needs attention": "/?status=failed&status=needs_attention",
    "failed + needs attention, longest": "/?status=failed&status=needs_attention"
                                         "&sort=-duration",
    "one agent, last updated": "/?agent=checkout&range=24h&sort=-updated",
    "last updated": "/?sort=-updated",
    "longest": "/?sort=-duration",
    "shortest, page 40": "/?sort=duration&page=40",
    "GET /api/runs, two statuses, by agent": "/api/runs?status=failed&status=paused"
                                             "&sort=agent",
}


def load(runs: int, steps: int) -> dict[str, float]:
    """The runs, their steps and approvals, in bulk SQL; the seconds each part took."""
    statements = {
        "runs": f"""
            INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,
                idempotency_key, submission_hash, created_at, updated_at, started_at,
                finished_at, finished_status)
            SELECT gen_random_uuid(), a.agent,
                   jsonb_build_object('order', 'ord-' || i, 'amount', i % 50000), s.status,
                   '', 0, '', '', c.at, c.at + (i % 900) * interval '1 second',
                   CASE WHEN s.status <> 'pending' THEN c.at + (i % 7) * interval '1 second'
                        END,
                   CASE WHEN s.status IN ('succeeded', 'compensated', 'needs_attention')
                        THEN c.at + (i % 900) * interval '1 second' END, ''
            FROM generate_series(1, {runs}) AS i,
                 LATERAL (SELECT now() - (i * interval '30 days' / {runs}) AS at) c,
                 LATERAL (SELECT (ARRAY['checkout', 'provision', 'travel', 'cleanup'])
                                 [1 + i % 4] AS agent) a,
                 LATERAL (SELECT CASE WHEN i % 1000 < 20 THEN 'failed'
                                      WHEN i % 1000 < 30 THEN 'needs_attention'
                                      WHEN i % 1000 < 36 THEN 'paused'
                                      WHEN i % 1000 < 38 THEN 'pending'
                                      WHEN i % 1000 < 40 THEN 'running'
                                      WHEN i % 1000 < 960 THEN 'succeeded'
                                      ELSE 'compensated' END AS status) s""",
        "steps": f"""
            INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at,
                finished_at, done_seq, "update", kind)
            SELECT r.id, r.code::text || '-' || s, 'node_' || (s % 7), '[]', 'succeeded', 1,
                   r.created_at + s * interval '1 second',
                   r.created_at + s * interval '1 second' + interval '200 ms', s,
                   jsonb_build_object('n', s), 'compensatable'
            FROM sagas_run r, generate_series(1, {steps}) AS s""",
        **APPROVALS,
        "vacuum analyze": "VACUUM ANALYZE",
    }
    return timed(statements, f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}")


def index_cost(n: int, rounds: int = 5) -> dict[bool, tuple[float, float]]:
    """What the runs list's indexes on ``updated_at`` (migration 0027) cost the journal: µs
    per run of an UPDATE of ``n`` runs' ``updated_at`` (each journal write sets it:
    ``DjangoJournal._write``), and the share of those updates PostgreSQL made in place (HOT),
    with the indexes and without, interleaved, best of ``rounds``. The indexes are dropped
    for the measure without them and made again."""
    import psycopg

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as db:
        ids = [r[0] for r in db.execute(
            "SELECT id FROM sagas_run ORDER BY id DESC LIMIT %s", [n])]
        times: dict[bool, list[float]] = {True: [], False: []}
        hot: dict[bool, list[float]] = {True: [], False: []}

        def hot_updates() -> int:
            db.execute("SELECT pg_stat_force_next_flush()")
            row = db.execute("SELECT n_tup_hot_upd FROM pg_stat_user_tables "
                             "WHERE relname = 'sagas_run'").fetchone()
            return int(row[0]) if row else 0

        made = {name: sql for name, sql in db.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN "
            "('sagas_run_updated', 'sagas_run_duration')")}
        assert len(made) == 2, made
        for _ in range(rounds):
            for indexed in (True, False):
                if not indexed:
                    db.execute("DROP INDEX sagas_run_updated, sagas_run_duration")
                before = hot_updates()
                t = time.perf_counter()
                db.execute("UPDATE sagas_run SET updated_at = clock_timestamp() "
                           "WHERE id = ANY(%s)", [ids])
                times[indexed].append((time.perf_counter() - t) / len(ids) * 1e6)
                hot[indexed].append((hot_updates() - before) / len(ids))
                if not indexed:
                    for sql in made.values():
                        db.execute(sql)
                db.execute("VACUUM sagas_run")  # the room for the next round's in-place ones
    return {k: (min(times[k]), max(hot[k])) for k in (True, False)}


def exports(user: object, n: int) -> tuple[float, float, int]:
    """p50 and p95 ms of ``n`` exports of the whole list (the row limit's worth), read to the
    end, and the rows of the last."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    times, rows = [], 0
    for _ in range(n + 1):
        t = time.perf_counter()
        response = client.get("/runs.csv", secure=True)
        body = b"".join(response.streaming_content)
        times.append((time.perf_counter() - t) * 1e3)
        rows = body.count(b"\n") - 1
    return pct(times[1:], 50), pct(times[1:], 95), rows


def main() -> None:
    parser = arguments(__doc__, "cockpit_runslist")
    parser.add_argument("--exports", type=int, default=5)
    parser.add_argument("--index-runs", type=int, default=2000,
                        help="runs whose updated_at is written to time the indexes on it")
    args = parser.parse_args()

    if not args.no_load:
        databases.recreate(DB_NAME)
    import django

    django.setup()
    from django.conf import settings

    from stateguard_web.sagas.models import Run, Step

    user, took = operator_after(None if args.no_load else lambda: load(args.runs, args.steps))
    print(f"{Run.objects.count()} runs, {Step.objects.count()} steps; load: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    args.plans.parent.mkdir(parents=True, exist_ok=True)
    results = measure(user, VIEWS, args.rounds, args.requests, args.plans)
    report(results, args.rounds, args.requests, args.plans)
    p50, p95, rows = exports(user, args.exports)
    print(f"\nCSV export of {rows} rows (STATEGUARD_RUNS_CSV_MAX_ROWS "
          f"{settings.STATEGUARD_RUNS_CSV_MAX_ROWS}), read to the end, {args.exports} times: "
          f"p50 {p50:.0f} ms, p95 {p95:.0f} ms")
    cost = index_cost(args.index_runs)
    print(f"\nan UPDATE of updated_at of {args.index_runs} runs, us per run (best of "
          f"5), in place (HOT): with the indexes of migration 0027 {cost[True][0]:.1f} us, "
          f"{cost[True][1]:.0%} HOT; without {cost[False][0]:.1f} us, {cost[False][1]:.0%} HOT")


if __name__ == "__main__":
    main()
