"""The Incidents page (issue 23, section 2) on 100 000 runs and 2 000 000 steps.

    .venv/bin/python bench/cockpit_incidents.py [--runs 100000] [--steps 20] [--incidents 0.1]
                                                [--rounds 5] [--requests 20] [--no-load]

A database of ``--runs`` runs over the last 30 days, each with ``--steps`` steps, of which a
share ``--incidents`` failed or need attention (an outage's worth: 10 %), spread over some thirty
(agent, step, error type) groups, one of them large. The incident runs get their status the way
the journal gives it (steps first, then one UPDATE of the run), so that migration 0022's trigger
fills their incident columns; its time is reported. Then VACUUM ANALYZE (what autovacuum does in
production; this machine's PostgreSQL has it off). The data is made by ``bench/cockpit.py``, which
``bench/cockpit_pages.py`` shares (with each run's audit event, compensations and charges).

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
import sys
import time
from pathlib import Path
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

from bench import cockpit, databases  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--incidents", type=float, default=0.1,
                        help="share of the runs that failed or need attention")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="per view and round")
    parser.add_argument("--trigger-runs", type=int, default=5000,
                        help="runs whose statuses are updated to time the trigger")
    parser.add_argument("--plans", type=Path,
                        default=ROOT / "var" / "bench" / "cockpit_incidents-plans.txt")
    parser.add_argument("--no-load", action="store_true",
                        help="measure the database the last run loaded, as it is")
    args = parser.parse_args()

    if not args.no_load:
        databases.recreate(DB_NAME)
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from stateguard_web.accounts import services as accounts
    from stateguard_web.runs import incidents
    from stateguard_web.sagas.models import Run, Step

    if args.no_load:
        took: dict[str, float] = {}
        user = get_user_model().objects.get(username="olivia")
    else:
        took = cockpit.load(f"postgresql://postgres@127.0.0.1:5432/{DB_NAME}", args.runs,
                            args.steps, args.incidents)
        user = get_user_model().objects.create_user("olivia")
        accounts.role_grant(user=user, role="operator")
    page = incidents.incident_groups(runs=Run.objects.all(), window="30d")
    largest = page.groups[0].filters
    batchable = next(g.filters for g in page.groups
                     if g.count <= settings.STATEGUARD_BATCH_MAX_RUNS)
    print(f"{Run.objects.count()} runs, {Step.objects.count()} steps, "
          f"{sum(g.count for g in page.groups)} incidents in {len(page.groups)} groups "
          f"(largest {page.groups[0].count}: {largest}); load: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    args.plans.parent.mkdir(parents=True, exist_ok=True)
    results = cockpit.measure(user, views(largest, batchable), args.rounds, args.requests,
                              args.plans)
    floor = results["floor (trivial view)"]
    print(f"\n{args.rounds} rounds x {args.requests} requests per view, interleaved; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'view':34} {'p50 ms':>7} {'p95 ms':>7} {'x floor p95':>11} {'cpu p50':>8} "
          f"{'queries':>7} {'db ms':>6}  plans")
    for name, r in results.items():
        print(f"{name:34} {r['p50']:7.1f} {r['p95']:7.1f} {r['p95'] / floor['p95']:11.1f} "
              f"{r['cpu50']:8.1f} {r['queries']:7d} {r['db_ms']:6.1f}  "
              f"{'seq scan: ' + ', '.join(sorted(r['seq'])) if r['seq'] else 'indexes'}")
    print(f"\nplans: {args.plans}")
    cost = trigger_cost(args.trigger_runs)
    print(f"\nstatus UPDATEs of {args.trigger_runs} runs, us per run (best of 5), trigger on / "
          f"off: a status no incident cares about {cost['other'][0]:.1f} / "
          f"{cost['other'][1]:.1f}; runs that fail {cost['fails'][0]:.1f} / "
          f"{cost['fails'][1]:.1f}")


if __name__ == "__main__":
    main()
