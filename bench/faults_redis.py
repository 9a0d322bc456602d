"""Issue 22, fault 2: Redis (the broker and the channel layer) restarts mid-load and loses its
data. No run may be lost (a pending run whose message vanished is queued again by the sweeper,
once), and a submission during the outage is answered 201 (stored, queued once the broker is
back) or 503 with nothing stored.

    .venv/bin/python bench/faults.py --fault redis [--runs 120] [--rate 2] [--restart-at 20]
        [--down 5] [--hold 5] [--workers 2] [--concurrency 2] [--port 6393] [--log-dir DIR]

Everything it uses is its own: a Redis without persistence on ``--port`` (killed ``--restart-at``
seconds after the first submission, started again empty ``--down`` seconds later; the workers
are stopped, SIGSTOP, ``--hold`` seconds before it goes down and go on once it is back, so that
about ``--rate`` x ``--hold`` runs' messages wait in the queue when Redis loses them), the
PostgreSQL database ``stateguard_faults_redis`` (dropped, created, migrated), localstripe, one
beat, ``--workers`` Celery workers and gunicorn (2 processes, ``DATABASE_POOL=4``), with
production's settings (DEBUG off, lease 10 s). ``--runs`` checkouts (a third set to fail their
booking, so that they unwind) go through ``POST /api/runs`` at ``--rate`` a second.

Counted (``bench/outage_load.py``): the API's answers by phase, from localstripe duplicate
charges, double refunds and orphan charges (``r1_chaos.count``), runs not settled, steps
journaled twice or lost, refused submissions that stored a run anyway, and runs the sweeper
queued again more than once. Exit status 1 when one is not 0. Figures: docs/reliability.md.
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

from bench import databases, outage_load
from tests.private_servers import PrivateRedis

DB_NAME = "stateguard_faults_redis"


def main(argv: list[str]) -> int:
    parser = outage_load.arguments("faults.py --fault redis", __doc__)
    parser.add_argument("--port", type=int, default=6393, help="the private Redis's port")
    parser.set_defaults(hold=5.0)  # messages waiting in the queue when Redis loses them
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="faults-redis-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    server = PrivateRedis(args.port, log_dir / "redis.log")
    outage_load.environment(f"postgres://postgres@127.0.0.1:5432/{DB_NAME}", server.url,
                            log_dir)
    databases.recreate(DB_NAME)
    server.start()
    try:
        return outage_load.run(args, log_dir, lambda: server.restart(args.down),
                               "faults redis")
    finally:
        server.close()
