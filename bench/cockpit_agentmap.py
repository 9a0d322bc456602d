"""The cockpit: an agent's map (issue 23, section 3) on a big journal.

    .venv/bin/python bench/cockpit_agentmap.py [--runs 100000] [--steps-per-run 20]
                                               [--requests 100] [--write-rounds 4] [--reuse]

1. Fills its own database ``stateguard_bench_map`` (dropped, created, migrated; with
   ``--reuse``, kept when it holds ``--runs`` runs, aged by the time since) in a few
   statements on the server (``INSERT ... SELECT`` over ``generate_series``): ``--runs`` runs
   of four agents created over the last 10 days (so the 7-day window holds 70 % of them),
   ``--steps-per-run`` steps each (2 million by default), in the proportions a busy deployment
   might show (90 % succeeded; compensated, failed, needing attention, paused, running and
   pending the rest), each run that did not succeed stopped at one of its agent's nodes or
   tools, with the approvals of the paused (pending), of a share of the compensated
   (rejected) and of the succeeded travel runs (approved: the past, which the map must not
   read); then ``VACUUM ANALYZE`` (autovacuum's work in production; off on this machine).
2. Times each page server-side through Django's test client (every middleware, the session,
   the navigation's counts, the template), as an operator, ``--requests`` times after 3 to warm
   up: the floor (``GET /bench/floor``, a sync view returning small JSON behind the same
   middleware: ``bench/p6_urls.py``), the navigation's counts (``GET /inbox/counts``: the
   session, the user and two counts, what every page asks), the travel map in each window,
   another agent's map, the API's map, and the runs list a click on a node opens; p50/p95 of
   the time, the median CPU time of this process (Django's own work), and the SQL statements
   of each (their time).
3. Writes the plan of every statement of each page (``EXPLAIN ANALYZE``) to
   ``var/bench/cockpit_agentmap-plans.txt`` and says which read a table whole.
4. What the map's index (``sagas_step_stopped``) costs the journal's writes: a step inserted
   started then updated succeeded, as the journal writes them, 5000 in a loop on the server
   (the database's work alone: no round trip, no commit each), with and without the index,
   alternated ``--write-rounds`` times.

Results: docs/benchmarks.md (the cockpit: an agent's map).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_bench_map"
os.environ.update({
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": "redis://127.0.0.1:6379/3",
    "DJANGO_SETTINGS_MODULE": "bench.p6_settings",  # the site's, and the floor's URL
    "DEBUG": "false",  # production's settings: Django keeps no query log
    "SECRET_KEY": "map-bench-" + "k" * 50,
    "STATEGUARD_ENV_FILE": "",  # not make run's .env
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
})
sys.path.insert(0, str(ROOT))

from bench import databases  # noqa: E402
from bench.cockpit import pct  # noqa: E402

# Each agent's nodes in the order its steps run (a travel run turns agent -> tools -> a tool),
# and where a run that did not succeed stopped (the node's step, its tool call too).
PATHS = {
    "travel": ["agent", "tools", "charge_card", "agent", "tools", "reserve_hotel", "agent",
               "tools", "send_confirmation", "agent"],
    "checkout": ["create_customer", "charge_user", "book_order"],
    "provision": ["create_group", "launch_instance", "attach_address", "create_record"],
    "cleanup": ["delete_object", "verify_gone"],
}
STOPS = {
    "travel": ["charge_card", "reserve_hotel", "reserve_hotel", "send_confirmation"],
    "checkout": ["charge_user", "book_order"],
    "provision": ["launch_instance", "attach_address", "create_record"],
    "cleanup": ["delete_object"],
}
AGENTS = ["travel", "travel", "checkout", "checkout", "provision", "cleanup"]  # by i % 6

PAGES = {
    "floor (trivial view)": "/bench/floor",
    # The least a dashboard request asks the database: the session, the user, the navigation's
    # two counts (what the map page asks besides its own statement).
    "navigation's counts": "/inbox/counts",
    "map travel, 1h": "/agents/travel/map?window=1h",
    "map travel, 24h": "/agents/travel/map?window=24h",
    "map travel, 7d": "/agents/travel/map?window=7d",
    "map checkout, 7d": "/agents/checkout/map?window=7d",
    "API map travel, 7d": "/api/agents/travel/map?window=7d",
    "runs at a node, 7d": "/?agent=travel&node=reserve_hotel&range=7d",
    "runs failed at a node, 7d": "/?agent=travel&node=reserve_hotel&range=7d&what=failed",
}


def _array(values: list[str]) -> str:
    return "ARRAY[" + ", ".join(f"'{v}'" for v in values) + "]"


def _by_agent(table: dict[str, list[str]], index: str) -> str:
    """SQL: the element ``index`` (1-based, wrapped) of the run's agent's list in ``table``
    (``%%``: for a statement with parameters)."""
    cases = " ".join(f"WHEN '{agent}' THEN ({_array(values)})[1 + ({index}) %% {len(values)}]"
                     for agent, values in table.items())
    return f"CASE r.agent {cases} END"


def fill(runs: int, per_run: int) -> None:
    from django.db import connection

    agents = _array(AGENTS)
    t = time.perf_counter()
    with connection.cursor() as cur:
        cur.execute(f"""
            INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,
                idempotency_key, submission_hash, created_at, updated_at, finished_status)
            SELECT gen_random_uuid(), ({agents})[1 + i %% 6],
                   jsonb_build_object('order', 'ord-' || i, 'amount', i %% 50000),
                   CASE WHEN i %% 1000 < 900 THEN 'succeeded'
                        WHEN i %% 1000 < 940 THEN 'compensated'
                        WHEN i %% 1000 < 960 THEN 'failed'
                        WHEN i %% 1000 < 975 THEN 'needs_attention'
                        WHEN i %% 1000 < 985 THEN 'paused'
                        WHEN i %% 1000 < 993 THEN 'running'
                        ELSE 'pending' END,
                   '', 0, '', '', now() - (i * interval '10 days' / %s),
                   now() - (i * interval '10 days' / %s), ''
            FROM generate_series(1, %s) AS i""", [runs, runs, runs])
        # Every step succeeded but a stopped run's last, which stands or stopped at one of its
        # agent's stopping nodes: started (running), paused (paused: the tools node of a travel
        # run, whose tool waits for approval), failed or violated (the others).
        path_node = _by_agent(PATHS, "s - 1")
        stop_node = _by_agent(STOPS, "r.id")
        cur.execute(f"""
            INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at,
                finished_at, done_seq, "update", kind)
            SELECT r.id, r.code::text || '-' || s,
                   CASE WHEN s = %(n)s AND r.status NOT IN ('succeeded', 'pending') THEN
                        CASE WHEN r.status = 'paused' AND r.agent = 'travel' THEN 'tools'
                             ELSE {stop_node} END
                        ELSE {path_node} END,
                   '[]',
                   CASE WHEN s < %(n)s OR r.status = 'succeeded' THEN 'succeeded'
                        WHEN r.status = 'running' THEN 'started'
                        WHEN r.status = 'paused' THEN 'paused'
                        WHEN r.id %% 5 = 0 THEN 'violated' ELSE 'failed' END,
                   1, r.created_at + s * interval '1 second',
                   r.created_at + s * interval '1 second' + interval '200 milliseconds',
                   s, jsonb_build_object('step', s, 'ok', true), 'compensatable'
            FROM sagas_run r CROSS JOIN generate_series(1, %(n)s) AS s
            WHERE r.status <> 'pending'""", {"n": per_run})
        cur.execute(f"""
            INSERT INTO sagas_approval (run_id, step_id, node, payload, status, decided_by,
                reason, requested_at, decided_at)
            SELECT id, code::text || '-gate', {_by_agent(STOPS, "r.id")},
                   '{{"amount": 25000}}',
                   CASE WHEN status = 'paused' THEN 'pending'
                        WHEN status = 'compensated' THEN 'rejected' ELSE 'approved' END,
                   CASE WHEN status = 'paused' THEN '' ELSE 'op' END, '', created_at,
                   CASE WHEN status = 'paused' THEN NULL ELSE updated_at END
            FROM sagas_run r
            WHERE status = 'paused' OR (status = 'compensated' AND id %% 4 = 0)
               OR (status = 'succeeded' AND agent = 'travel' AND id %% 4 = 0)""", [])
        cur.execute("SELECT count(*) FROM sagas_step")
        steps = cur.fetchone()[0]
    connection.close()
    import psycopg

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as db:
        db.execute("VACUUM ANALYZE")
        size = db.execute("SELECT pg_size_pretty(pg_database_size(current_database()))"
                          ).fetchone()[0]
        stopped = db.execute("SELECT pg_size_pretty(pg_relation_size('sagas_step_stopped'))"
                             ).fetchone()[0]
    print(f"filled: {runs} runs, {steps} steps in {time.perf_counter() - t:.0f} s "
          f"(database {size}; sagas_step_stopped {stopped})", flush=True)


def operator() -> Any:
    from django.contrib.auth import get_user_model

    from stateguard_web.accounts import services as accounts

    user = get_user_model().objects.create_user("map-operator", password="map-pw")
    accounts.role_grant(user=user, role="operator")
    return user


def time_pages(user: Any, requests: int, plans_to: Path) -> dict[str, tuple[float, ...]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(user)
    results, plans, whole = {}, [], []
    for name, url in PAGES.items():
        for _ in range(3):  # warm up: the process's caches (graphs, agents), prepared plans
            assert client.get(url, secure=True).status_code == 200, url
        times, cpu = [], []
        for _ in range(requests):
            t, c = time.perf_counter(), time.process_time()
            response = client.get(url, secure=True)
            times.append((time.perf_counter() - t) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
            assert response.status_code == 200
        with CaptureQueriesContext(connection) as queries:
            client.get(url, secure=True)
        db_ms = sum(float(q["time"]) for q in queries.captured_queries) * 1e3
        results[name] = (pct(times, 50), pct(times, 95), pct(cpu, 50),
                         len(queries.captured_queries), db_ms)
        for q in queries.captured_queries:
            sql = q["sql"]
            if "sagas_" not in sql:
                continue
            with connection.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS OFF) " + sql)
                plan = "\n".join(r[0] for r in cur.fetchall())
            plans.append(f"-- {name}: {url}\n{sql}\n{plan}\n")
            whole += [f"{name}: {m}" for m in re.findall(r"Seq Scan on (sagas_\w+)", plan)]
    plans_to.parent.mkdir(parents=True, exist_ok=True)
    plans_to.write_text("\n".join(plans))
    print(f"plans: {plans_to}; tables read whole: {sorted(set(whole)) or 'none'}")
    return results


def write_cost(rounds: int, steps: int = 5000) -> list[tuple[float, float]]:
    """µs per step (an INSERT as started, an UPDATE to succeeded) with and without the map's
    index, the steps written by a loop on the server: one round trip per round, so that what
    is timed is the database's work, not this machine's scheduling of two processes."""
    import psycopg
    from django.db import connection

    from stateguard_web.sagas.models import Step

    index = next(i for i in Step._meta.indexes if i.name == "sagas_step_stopped")
    with connection.schema_editor() as editor:  # the migration's own statements
        create, drop = str(index.create_sql(Step, editor)), str(index.remove_sql(Step, editor))
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as db:
        run_id = db.execute("SELECT max(id) FROM sagas_run").fetchone()[0]

        def one_round(tag: str) -> float:
            t = time.perf_counter()
            db.execute(f"""DO $$ BEGIN FOR n IN 1..{steps} LOOP
                INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at,
                    kind) VALUES ({run_id}, 'write-{tag}-' || n, 'tools', '[]', 'started', 1,
                    now(), 'compensatable');
                UPDATE sagas_step SET status = 'succeeded', finished_at = now(),
                    "update" = '{{"ok": true}}'
                    WHERE run_id = {run_id} AND step_id = 'write-{tag}-' || n;
                END LOOP; END $$""")
            return (time.perf_counter() - t) * 1e6 / steps

        one_round("warm-up")
        out = []
        for r in range(rounds):  # in turn: with first, then without first
            timed = {}
            for indexed in ((True, False) if r % 2 == 0 else (False, True)):
                if not indexed:
                    db.execute(drop)
                timed[indexed] = one_round(f"{r}-{indexed}")
                if not indexed:
                    db.execute(create)
            out.append((timed[True], timed[False]))
        db.execute("DELETE FROM sagas_step WHERE step_id LIKE 'write-%'")
    return out


def _filled(runs: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}") as db:
            return bool(db.execute("SELECT count(*) FROM sagas_run").fetchone()[0] == runs)
    except psycopg.Error:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps-per-run", type=int, default=20)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--write-rounds", type=int, default=4)
    parser.add_argument("--reuse", action="store_true",
                        help="keep the database of an earlier run with as many runs")
    args = parser.parse_args()

    if not (args.reuse and _filled(args.runs)):
        databases.recreate(DB_NAME)
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    if not get_user_model().objects.exists():
        fill(args.runs, args.steps_per_run)
    user = get_user_model().objects.filter(username="map-operator").first() or operator()
    results = time_pages(user, args.requests,
                         ROOT / "var" / "bench" / "cockpit_agentmap-plans.txt")
    print(f"\n{'page':28} {'p50 ms':>8} {'p95 ms':>8} {'CPU p50':>8} {'queries':>8} "
          f"{'SQL ms':>8}")
    for name, (p50, p95, cpu, queries, db_ms) in results.items():
        print(f"{name:28} {p50:8.1f} {p95:8.1f} {cpu:8.1f} {queries:8d} {db_ms:8.1f}")
    if args.write_rounds:
        print("\nthe map's index on the journal's writes, µs per step (start + finish):")
        for with_index, without in write_cost(args.write_rounds):
            print(f"  with {with_index:.1f}  without {without:.1f}  "
                  f"({(with_index / without - 1) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
