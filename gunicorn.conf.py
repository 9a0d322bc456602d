"""gunicorn's settings for StateGuard's HTTP: ``gunicorn`` run from the repository root reads this
file by itself (docs/deploy.md, "Processes"). Websockets are Daphne's (``stateguard_web.asgi``).

The command line, or ``GUNICORN_CMD_ARGS`` in the environment, overrides any of these
(``gunicorn --bind 10.0.0.5:8000 --workers 4``); ``WEB_CONCURRENCY`` sets the processes.
"""

from __future__ import annotations

import os

wsgi_app = "stateguard_web.wsgi:application"
bind = ["127.0.0.1:8000"]  # behind the proxy, never on a public address

# One process per core: a process runs Python on one core at a time (the GIL), and an API
# request is mostly Python (P6, docs/benchmarks.md).
workers = int(os.environ.get("WEB_CONCURRENCY") or os.cpu_count() or 1)
# Each process listens on a socket of its own (SO_REUSEPORT) and the kernel spreads new
# connections over them. On one shared socket, the process that wins the first accepts keeps
# the proxy's kept-alive connections, and the other processes idle (P6: one process served
# every request of 16 keep-alive clients while the other did nothing).
reuse_port = True
# A few threads per process, so that a request waiting (on PostgreSQL, Redis, or Stripe for a
# refund by hand, up to the SDK's 80 s) does not hold up the process's other requests. No more
# than DATABASE_POOL (4 in production): each request thread borrows one pooled connection, and
# more threads than connections would wait for one.
worker_class = "gthread"
threads = 4

# Idle keep-alive connections wait in the process's poller, not on a thread. Longer than the
# proxy keeps an idle upstream connection (nginx: 60 s), so that the proxy never sends a
# request on a connection gunicorn is closing.
keepalive = 75

# A header line up to 16 KiB, as under Daphne (Twisted's line limit; docs/api.md): over it,
# gunicorn answers 431 itself. A request line: gunicorn's most, 8190 bytes (then 414).
limit_request_field_size = 16384
limit_request_line = 8190

# One line per request on stdout, as Daphne logs them, unless STATEGUARD_ACCESS_LOG=off: behind
# the proxy (docs/deploy.md) its log is the access log, and gunicorn's own line costs 3-6 % of
# every API request's CPU (P6, docs/benchmarks.md). On by default: a gunicorn reached without
# a proxy (a test, a first install) would otherwise log no request at all.
_access_log = os.environ.get("STATEGUARD_ACCESS_LOG", "on").strip().lower()
if _access_log not in ("on", "off"):
    raise SystemExit(f"STATEGUARD_ACCESS_LOG must be 'on' or 'off', not {_access_log!r}")
accesslog = "-" if _access_log == "on" else None

# gunicorn's control socket (gunicornc) is at one path per user ($XDG_RUNTIME_DIR or ~/.gunicorn):
# a second gunicorn on the host would take the first one's. Its signals do the same work (HUP
# reloads, TTIN/TTOU add or remove a process, TERM stops after the requests in flight).
control_socket_disable = True


def post_worker_init(worker: object) -> None:
    """Each process, its application loaded: what it started with left out of the garbage
    collector's counts, as in the Celery pool processes (stateguard_web/lib/startup_gc.py)."""
    from stateguard_web.lib.startup_gc import freeze_startup_objects

    freeze_startup_objects()
