"""The Incidents page (issue 23, section 2) on 100 000 runs and 2 000 000 steps.

    .venv/bin/python bench/cockpit_incidents.py [--runs 100000] [--steps 20] [--incidents 0.1]
                                                [--rounds 5] [--requests 20] [--no-load]

A database of ``--runs`` runs over the last 30 days, each with ``--steps`` steps, of which a
share ``--incidents`` failed or need attention (an outage's worth: 10 %), spread over some thirty
(agent, step, error type) groups, one of them large. The incident runs get their status the way
the journal gives it (steps first, then one UPDATE of the run), so that migration 0022's trigger
fills their incident columns; its time is reported. Then VACUUM ANALYZE (what autovacuum does in
production; this machine's PostgreSQL has it off).

Each view is asked for as an operator through Django's test client (middleware, queries,
template: the server's time, no network), ``--rounds`` rounds of ``--requests`` requests per
view, the views interleaved within each round so that the machine's noise falls on all alike:

- **floor**: a trivial JSON view behind the same middleware (``bench/p6_urls.py``);
- the Incidents page: over 24 h, over 7 days, failed only latest first;
- ``GET /api/incidents``;
- the runs list narrowed to the largest group (``?status&agent&step&error_type``);
- the batch confirmation of the largest group a batch takes (at most
  ``STATEGUARD_BATCH_MAX_RUNS``), as its "Retry N runs…" link opens it.

p50/p95 of wall time and of this process's CPU per request, queries per request, and the plan
of every query of each view (EXPLAIN (ANALYZE, BUFFERS)), written to a file; the ``sagas_``
tables a view's plans read by a sequential scan are named. The runs list as it was before
(``/``, P5's) is measured beside them, for scale.

Last, what the trigger costs a write: an UPDATE of ``--trigger-runs`` runs' statuses with it and
with it disabled, interleaved (per run: the row trigger's work, no round trips).

Uses its own database ``stateguard_cockpit_incidents`` (dropped and created) and Redis database
6. Results: docs/benchmarks.md ("Incidents").
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "stateguard_cockpit_incidents"
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB_NAME}",
    "REDIS_URL": "redis://127.0.0.1:6379/6",
    "DJANGO_SETTINGS_MODULE": "bench.p6_settings",  # the site's, and the floor view
    "DEBUG": "false",  # production's settings: Django keeps no query log
    "SECRET_KEY": "cockpit-bench-" + "k" * 50,
    "STATEGUARD_ENV_FILE": "",
    "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
}
os.environ.update(ENV)
sys.path.insert(0, str(ROOT))

from bench import databases  # noqa: E402

# The groups: (agent, status, step, error type, weight). One outage dominates, as in life.
GROUPS = [
    ("checkout", "failed", "charge_user", "APIConnectionError", 40),
    ("checkout", "failed", "charge_user", "RateLimitError", 6),
    ("checkout", "failed", "charge_user", "CardError", 4),
    ("checkout", "failed", "create_customer", "APIConnectionError", 4),
    ("checkout", "failed", "book_order", "BookingFailed", 3),
    ("checkout", "needs_attention", "book_order", "BookingFailed", 8),
    ("checkout", "needs_attention", "charge_user", "InvariantViolation", 2),
    ("checkout", "needs_attention", "send_receipt", "SMTPServerDisconnected", 2),
    ("provision", "failed", "launch_instance", "ClientError", 5),
    ("provision", "failed", "launch_instance", "WaiterError", 2),
    ("provision", "failed", "create_record", "Throttling", 3),
    ("provision", "failed", "attach_address", "ClientError", 1),
    ("provision", "needs_attention", "create_record", "ClientError", 4),
    ("provision", "needs_attention", "launch_instance", "InDoubt", 1),
    ("provision", "needs_attention", "", "UnknownAgent", 1),
    ("travel", "failed", "reserve_hotel", "ToolError", 3),
    ("travel", "failed", "charge_card", "APIConnectionError", 2),
    ("travel", "failed", "agent", "RateLimitError", 2),
    ("travel", "needs_attention", "reserve_hotel", "NoRoom", 3),
    ("travel", "needs_attention", "send_confirmation", "SMTPRecipientsRefused", 1),
    ("cleanup", "failed", "delete_object", "ClientError", 1),
    ("cleanup", "failed", "verify_gone", "AssertionError", 1),
    ("cleanup", "needs_attention", "delete_object", "NoSuchVersion", 1),
    ("noop5", "failed", "s3", "ValueError", 1),
]
# The approvals of a journal of runs, as the navigation's counts read them (cockpit_runslist's
# too): the pending one of each paused run, as P5's list has, and the decided ones of the
# past, which the count must not read (P5's, likewise).
APPROVALS = {
    "approvals": """
        INSERT INTO sagas_approval (run_id, step_id, node, payload, status, decided_by,
            reason, requested_at)
        SELECT id, 'charge:' || code, 'charge_user', '{"amount": 25000}', 'pending', '', '',
               updated_at
        FROM sagas_run WHERE status = 'paused'""",
    "decided approvals": """
        INSERT INTO sagas_approval (run_id, step_id, node, payload, status, decided_by,
            reason, requested_at, decided_at)
        SELECT id, 'charge:' || code, 'charge_user', '{"amount": 25000}', 'approved', 'op',
               '', created_at, updated_at
        FROM sagas_run WHERE status = 'succeeded' AND agent = 'checkout'""",
}
NODES = ["create_customer", "charge_user", "book_order", "send_receipt", "launch_instance",
         "create_record", "attach_address", "reserve_hotel", "charge_card", "agent"]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _case(column: str, field: int) -> str:
    """SQL: the ``field`` of the group (``GROUPS``) that the run whose id is ``column`` is in:
    group i takes the ids whose remainder by the sum of the weights falls in its share."""
    weights, at, whens = sum(g[4] for g in GROUPS), 0, []
    for group in GROUPS:
        whens.append(f"WHEN {column} % {weights} BETWEEN {at} AND {at + group[4] - 1} "
                     f"THEN '{group[field]}'")
        at += group[4]
    return f"CASE {' '.join(whens)} END"


def load(runs: int, steps: int, share: float) -> dict[str, float]:
    """The runs and their steps, in bulk SQL (the incident runs "running" meanwhile); then the
    incidents' statuses and errors by one UPDATE, which the trigger of migration 0022 follows
    for each. Returns the seconds each part took."""
    nodes = "ARRAY[" + ", ".join(f"'{n}'" for n in NODES) + "]"
    statements = {
        "runs": f"""
            INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,
                idempotency_key, submission_hash, created_at, updated_at, finished_status)
            SELECT gen_random_uuid(),
                   (ARRAY['checkout', 'provision', 'travel', 'cleanup'])[1 + i % 4],
                   jsonb_build_object('order', 'ord-' || i, 'amount', i % 50000),
                   CASE WHEN i % 1000 < {round(share * 1000)} THEN 'running'
                        WHEN i % 1000 < 960 THEN 'succeeded'
                        WHEN i % 1000 < 985 THEN 'compensated'
                        WHEN i % 1000 < 993 THEN 'paused'
                        ELSE 'pending' END,
                   '', 0, '', '', now() - (i * interval '30 days' / {runs}),
                   now() - (i * interval '30 days' / {runs}), ''
            FROM generate_series(1, {runs}) AS i""",
        "steps": f"""
            INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at,
                finished_at, done_seq, "update", kind)
            SELECT r.id, r.code::text || '-' || s, ({nodes})[1 + (r.id + s) % {len(NODES)}],
                   '[]', 'succeeded', 1, r.created_at + s * interval '1 second',
                   r.created_at + s * interval '1 second' + interval '200 ms', s,
                   jsonb_build_object('n', s), 'compensatable'
            FROM sagas_run r, generate_series(1, {steps - 1}) AS s""",
        # the last step: an incident's failed at its group's node (none: an unknown agent's)
        "last steps": f"""
            INSERT INTO sagas_step (run_id, step_id, node, tags, status, attempt, started_at,
                finished_at, error, kind)
            SELECT r.id, r.code::text || '-last', COALESCE(NULLIF(g.node, ''), 'last'), '[]',
                   CASE WHEN g.node <> '' THEN 'failed' ELSE 'succeeded' END, 1,
                   r.created_at + interval '1 minute', r.created_at + interval '61 seconds',
                   CASE WHEN g.node <> '' THEN jsonb_build_object(
                       'type', g.kind, 'message', 'it broke, run ' || r.id,
                       'traceback', 'Traceback ...') END, 'compensatable'
            FROM sagas_run r, LATERAL (SELECT CASE WHEN r.status = 'running'
                                                   THEN {_case("r.id", 2)} ELSE '' END AS node,
                                              {_case("r.id", 3)} AS kind) g""",
        "incident UPDATE (trigger)": f"""
            UPDATE sagas_run SET agent = {_case("id", 0)}, status = {_case("id", 1)},
                error = jsonb_build_object('type', {_case("id", 3)}, 'message',
                                           'it broke, run ' || id, 'traceback', ''),
                updated_at = created_at + interval '61 seconds'
            WHERE status = 'running'""",
        **APPROVALS,
        "vacuum analyze": "VACUUM ANALYZE",
    }
    return timed(statements, DB_NAME)


def timed(statements: dict[str, str], database: str) -> dict[str, float]:
    """Run each of ``statements`` on ``database``, in order; the seconds each took."""
    import psycopg

    took: dict[str, float] = {}
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{database}",
                         autocommit=True) as db:
        for name, sql in statements.items():
            t = time.perf_counter()
            db.execute(sql.encode())  # bytes: no placeholders, the % are modulos
            took[name] = time.perf_counter() - t
    return took


def trigger_cost(n: int, rounds: int = 5) -> dict[str, tuple[float, float]]:
    """µs per run of an UPDATE of ``n`` runs' statuses (one statement: the row trigger's work,
    no round trips), with migration 0022's trigger and with it disabled, interleaved, best of
    ``rounds``: a status change no incident cares about (succeeded -> running, the WHEN clause
    alone), and runs that fail (running -> failed: the function and its step lookup)."""
    import psycopg

    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}",
                         autocommit=True) as db:
        ids = [r[0] for r in db.execute(
            "SELECT id FROM sagas_run WHERE status = 'succeeded' ORDER BY id LIMIT %s", [n])]
        times: dict[str, dict[bool, list[float]]] = {"other": {True: [], False: []},
                                                     "fails": {True: [], False: []}}
        update = "UPDATE sagas_run SET status = %s, updated_at = now() WHERE id = ANY(%s)"
        for _ in range(rounds):
            for on in (True, False):
                db.execute("ALTER TABLE sagas_run " + ("ENABLE" if on else "DISABLE")
                           + " TRIGGER sagas_run_incident_update")
                for kind, status in (("other", "running"), ("fails", "failed")):
                    db.execute(update, ["running", ids])  # from running, as a worker's write
                    t = time.perf_counter()
                    db.execute(update, [status, ids])
                    times[kind][on].append((time.perf_counter() - t) / len(ids) * 1e6)
                    db.execute(update, ["succeeded", ids])
        db.execute("ALTER TABLE sagas_run ENABLE TRIGGER sagas_run_incident_update")
        db.execute("VACUUM ANALYZE sagas_run")  # as loaded, for a run with --no-load
    return {kind: (min(t[True]), min(t[False])) for kind, t in times.items()}


def views(largest: dict[str, str], batchable: dict[str, str]) -> dict[str, str]:
    return {
        "floor (trivial view)": "/bench/floor",
        "incidents, 24 h": "/incidents/",
        "incidents, 7 days": "/incidents/?window=7d",
        "incidents, failed, latest first": "/incidents/?status=failed&sort=recent",
        "GET /api/incidents": "/api/incidents",
        "runs list, largest group": "/?" + urlencode(largest),
        "runs list (as before, for scale)": "/",
        "batch confirmation, a group": "/batches/new?" + urlencode(
            {"action": "retry" if batchable["status"] == "failed" else "retry_compensations",
             "scope": "filter", **batchable}),
    }


def measure(user: Any, urls: dict[str, str], rounds: int, requests: int, plans_to: Path
            ) -> dict[str, dict[str, Any]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(user)
    wall: dict[str, list[float]] = {name: [] for name in urls}
    cpu: dict[str, list[float]] = {name: [] for name in urls}
    for url in urls.values():
        for _ in range(3):  # warm up: templates, the ORM's caches, the key cache
            assert client.get(url, secure=True).status_code == 200, url
    for _ in range(rounds):
        for name, url in urls.items():
            for _ in range(requests):
                t, c = time.perf_counter(), time.process_time()
                response = client.get(url, secure=True)
                wall[name].append((time.perf_counter() - t) * 1e3)
                cpu[name].append((time.process_time() - c) * 1e3)
                assert response.status_code == 200, (url, response.status_code)
    results, plans = {}, []
    for name, url in urls.items():
        with CaptureQueriesContext(connection) as queries:
            client.get(url, secure=True)
        seq: set[str] = set()
        for q in queries.captured_queries:
            if "sagas_" not in q["sql"]:
                continue
            with connection.cursor() as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
                plan = "\n".join(r[0] for r in cur.fetchall())
            seq |= set(re.findall(r"Seq Scan on (sagas_\w+)", plan))
            plans.append(f"-- {name}: {url}\n{q['sql']}\n{plan}\n")
        results[name] = {"p50": pct(wall[name], 50), "p95": pct(wall[name], 95),
                         "cpu50": pct(cpu[name], 50), "cpu95": pct(cpu[name], 95),
                         "queries": len(queries.captured_queries),
                         "db_ms": sum(float(q["time"]) for q in queries.captured_queries) * 1e3,
                         "seq": seq}
    plans_to.write_text("\n".join(plans))
    return results


def arguments(doc: str, name: str) -> argparse.ArgumentParser:
    """The options of a cockpit bench: its database's size, its rounds, where its plans go."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="per view and round")
    parser.add_argument("--plans", type=Path, default=ROOT / "var" / "bench" / f"{name}-plans.txt")
    parser.add_argument("--no-load", action="store_true",
                        help="measure the database the last run loaded, as it is")
    return parser


def operator_after(load_it: Callable[[], dict[str, float]] | None
                   ) -> tuple[Any, dict[str, float]]:
    """olivia, an operator, made once ``load_it`` loaded the database, and the seconds each
    part of the load took; with None (``--no-load``), the olivia of the last load."""
    from django.contrib.auth import get_user_model

    from stateguard_web.accounts import services as accounts

    if load_it is None:
        return get_user_model().objects.get(username="olivia"), {}
    took = load_it()
    user = get_user_model().objects.create_user("olivia")
    accounts.role_grant(user=user, role="operator")
    return user, took


def report(results: dict[str, dict[str, Any]], rounds: int, requests: int, plans: Path) -> None:
    """``measure``'s results as a table, each view's p95 beside the floor's."""
    floor = results["floor (trivial view)"]
    width = max(len(name) for name in results)
    print(f"\n{rounds} rounds x {requests} requests per view, interleaved; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'view':{width}} {'p50 ms':>7} {'p95 ms':>7} {'x floor p95':>11} {'cpu p50':>8} "
          f"{'queries':>7} {'db ms':>6}  plans")
    for name, r in results.items():
        print(f"{name:{width}} {r['p50']:7.1f} {r['p95']:7.1f} {r['p95'] / floor['p95']:11.1f} "
              f"{r['cpu50']:8.1f} {r['queries']:7d} {r['db_ms']:6.1f}  "
              f"{'seq scan: ' + ', '.join(sorted(r['seq'])) if r['seq'] else 'indexes'}")
    print(f"\nplans: {plans}")


def main() -> None:
    parser = arguments(__doc__, "cockpit_incidents")
    parser.add_argument("--incidents", type=float, default=0.1,
                        help="share of the runs that failed or need attention")
    parser.add_argument("--trigger-runs", type=int, default=5000,
                        help="runs whose statuses are updated to time the trigger")
    args = parser.parse_args()

    if not args.no_load:
        databases.recreate(DB_NAME)
    import django

    django.setup()
    from django.conf import settings

    from stateguard_web.runs import incidents
    from stateguard_web.sagas.models import Run, Step

    user, took = operator_after(
        None if args.no_load else lambda: load(args.runs, args.steps, args.incidents))
    page = incidents.incident_groups(runs=Run.objects.all(), window="30d")
    largest = page.groups[0].filters
    batchable = next(g.filters for g in page.groups
                     if g.count <= settings.STATEGUARD_BATCH_MAX_RUNS)
    print(f"{Run.objects.count()} runs, {Step.objects.count()} steps, "
          f"{sum(g.count for g in page.groups)} incidents in {len(page.groups)} groups "
          f"(largest {page.groups[0].count}: {largest}); load: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    args.plans.parent.mkdir(parents=True, exist_ok=True)
    results = measure(user, views(largest, batchable), args.rounds, args.requests, args.plans)
    report(results, args.rounds, args.requests, args.plans)
    cost = trigger_cost(args.trigger_runs)
    print(f"\nstatus UPDATEs of {args.trigger_runs} runs, us per run (best of 5), trigger on / "
          f"off: a status no incident cares about {cost['other'][0]:.1f} / "
          f"{cost['other'][1]:.1f}; runs that fail {cost['fails'][0]:.1f} / "
          f"{cost['fails'][1]:.1f}")


if __name__ == "__main__":
    main()
