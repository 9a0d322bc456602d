"""Issue 22, fault 3: PostgreSQL restarts mid-load (stopped as a crash stops it: every
connection cut). Workers, the web and the sweeper reconnect by themselves; every run settles;
no step is journaled twice or lost; a submission during the outage is answered 201 or 503 with
nothing stored.

    .venv/bin/python bench/faults.py --fault postgres [--runs 120] [--rate 2] [--restart-at 20]
        [--down 5] [--workers 2] [--concurrency 2] [--port 5443] [--redis-port 6394]
        [--log-dir DIR]

Everything it uses is its own: a PostgreSQL cluster made with ``initdb`` on ``--port`` (its
database migrated; stopped ``-m immediate`` ``--restart-at`` seconds after the first submission
and started again ``--down`` seconds later), a Redis of its own on ``--redis-port`` (a
database of the shared one would be shared with whatever else uses it: its workers would
take this bench's messages), localstripe, one beat, ``--workers`` Celery workers and
gunicorn (2 processes, ``DATABASE_POOL=4``), with production's settings (DEBUG off, lease
10 s). The load and the counts are ``bench/outage_load.py``'s (see ``faults_redis.py``);
``--hold`` is 0 here: the workers keep running, so runs are mid-step when the connections
are cut.
Figures: docs/reliability.md.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import outage_load
from tests.private_servers import PrivatePostgres, PrivateRedis

DB_NAME = "stateguard_faults_postgres"


def main(argv: list[str]) -> int:
    parser = outage_load.arguments("faults.py --fault postgres", __doc__)
    parser.add_argument("--port", type=int, default=5443, help="the private PostgreSQL's port")
    parser.add_argument("--redis-port", type=int, default=6394)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="faults-postgres-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    server = PrivatePostgres(args.port, log_dir / "postgres.log")
    broker = PrivateRedis(args.redis_port, log_dir / "redis.log")
    outage_load.environment(server.url(DB_NAME), broker.url, log_dir)
    server.start()
    broker.start()
    try:
        server.create(DB_NAME)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], check=True,
                       cwd=outage_load.ROOT)
        return outage_load.run(args, log_dir, lambda: server.restart(args.down),
                               "faults postgres")
    finally:
        server.close()
        broker.close()
