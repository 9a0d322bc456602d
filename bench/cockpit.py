"""What the cockpit's benches share (``cockpit_incidents.py``, ``cockpit_pages.py``): the database
of 100 000 runs and 2 million steps an outage left behind, made in bulk SQL, and the timing of
pages through Django's test client with the plan of each of their queries.

Imported before Django is set up: nothing here reads settings until it is called.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

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


def load(url: str, runs: int, steps: int, share: float) -> dict[str, float]:
    """The runs and their steps, in bulk SQL (the incident runs "running" meanwhile); then the
    incidents' statuses and errors by one UPDATE, which the trigger of migration 0022 follows
    for each. Returns the seconds each part took."""
    nodes = "ARRAY[" + ", ".join(f"'{n}'" for n in NODES) + "]"
    statements = {
        "runs": f"""
            INSERT INTO sagas_run (code, agent, input, status, lease_owner, fencing_token,
                idempotency_key, submission_hash, created_at, updated_at, finished_status,
                started_at, finished_at, agent_version, graph_digest)
            SELECT gen_random_uuid(),
                   (ARRAY['checkout', 'provision', 'travel', 'cleanup'])[1 + i % 4],
                   jsonb_build_object('order', 'ord-' || i, 'amount', i % 50000),
                   CASE WHEN i % 1000 < {round(share * 1000)} THEN 'running'
                        WHEN i % 1000 < 960 THEN 'succeeded'
                        WHEN i % 1000 < 985 THEN 'compensated'
                        WHEN i % 1000 < 993 THEN 'paused'
                        ELSE 'pending' END,
                   '', 0, '', '', now() - (i * interval '30 days' / {runs}),
                   now() - (i * interval '30 days' / {runs}), '',
                   -- taken a second after it was made, over a minute later: the triggers
                   -- keep these (and clear them where the status says not yet), so that the
                   -- workers page's runs per minute read a month's, not one minute's
                   LEAST(now(), now() - (i * interval '30 days' / {runs}) + interval '1 second'),
                   LEAST(now(), now() - (i * interval '30 days' / {runs})
                                + interval '61 seconds'),
                   -- submitted on a version, as every run since migration 0026
                   '1', substr(md5((ARRAY['checkout', 'provision', 'travel', 'cleanup'])
                                   [1 + i % 4]), 1, 16)
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
                updated_at = created_at + interval '61 seconds',
                finished_at = LEAST(now(), created_at + interval '61 seconds')
            WHERE status = 'running'""",
        **APPROVALS,
        # What a run's page reads besides its steps, so that their plans face tables of a
        # size: each run's submission in the audit log, the compensations of the compensated
        # runs (their first three steps), a charge in the ledger for each checkout.
        "audit events": """
            INSERT INTO sagas_auditevent (actor, action, data, created_at, run_id, run_code)
            SELECT 'api', 'run.submitted', jsonb_build_object('agent', agent), created_at, id,
                   code
            FROM sagas_run""",
        "compensations": """
            INSERT INTO sagas_compensation (node, idempotency_key, status, triggered_by,
                created_at, updated_at, run_id, step_id)
            SELECT s.node, 'undo:' || s.step_id, 'succeeded', 'automatic',
                   r.updated_at, r.updated_at, r.id, s.id
            FROM sagas_run r JOIN sagas_step s ON s.run_id = r.id AND s.done_seq <= 3
            WHERE r.status = 'compensated'""",
        "effects": """
            INSERT INTO sagas_effect (step_id, node, provider, kind, external_id, amount,
                currency, idempotency_key, undoes, status, recorded_at, run_id)
            SELECT code::text || '-2', 'charge_user', 'stripe', 'charge', 'ch_' || id,
                   1 + id % 50000, 'usd', 'charge:' || code, '',
                   CASE WHEN status = 'compensated' THEN 'compensated' ELSE 'applied' END,
                   created_at + interval '2 seconds', id
            FROM sagas_run WHERE agent = 'checkout' AND status <> 'pending'""",
        "vacuum analyze": "VACUUM ANALYZE",
    }
    return timed(statements, url)




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


def timed(statements: dict[str, str], url: str) -> dict[str, float]:
    """Run each of ``statements`` on the database at ``url``, in order; the seconds each
    took."""
    import psycopg

    took: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as db:
        for name, sql in statements.items():
            t = time.perf_counter()
            db.execute(sql.encode())  # bytes: no placeholders, the % are modulos
            took[name] = time.perf_counter() - t
    return took


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
